//! railguard-extender's shell (being split out of the library).
