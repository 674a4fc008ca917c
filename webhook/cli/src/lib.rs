//! railguard-webhook's shell (being split out of the library).
