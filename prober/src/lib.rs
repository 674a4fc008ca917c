//! railguard prober (being built).
