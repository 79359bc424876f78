//! The `edgevirt` binary: all roles and the CLI live in the library; this only starts it.

fn main() -> std::process::ExitCode {
    edgevirt::cli::main()
}
