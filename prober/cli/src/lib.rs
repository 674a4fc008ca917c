//! railguard-prober's shell (being split out of the library).
