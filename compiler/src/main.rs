//! `edgeform`: see the library's [`compiler::cli`].

fn main() -> std::process::ExitCode {
    compiler::cli::main()
}
