fn main() {
    eprintln!("railguard-prober: not built yet");
    std::process::exit(2);
}
