//! railguard extender (being built).
