fn main() -> std::process::ExitCode {
    elm::cli::main()
}
