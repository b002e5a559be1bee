//! The `elm` command line: a thin shell over the library (see `src/cli/`).

mod cli;

// Counts heap bytes so a command can measure its probe step (`elm::memory`).
#[global_allocator]
static HEAP: elm::heap::CountingAlloc = elm::heap::CountingAlloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
