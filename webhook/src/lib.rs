//! railguard webhook (being built).
