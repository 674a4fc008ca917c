fn main() {
    eprintln!("railguard-webhook: not built yet");
    std::process::exit(2);
}
