//! railguard simulation (being moved out of the production crates).
