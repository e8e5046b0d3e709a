//! The command line of a bench whose figures come from valgrind
//! (`instructions` under callgrind, `lookup_counts` under cachegrind):
//! its scripts pass the arguments, and `cargo bench` only `--bench`.

/// The arguments after the program's name, less the `--bench` that
/// `cargo bench` appends. Run by `cargo bench` with nothing else, the
/// program has nothing to measure outside valgrind: this says which
/// script measures `name` and exits.
pub fn args(name: &str, script: &str) -> Vec<String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<String> = all.iter().filter(|a| *a != "--bench").cloned().collect();
    if args.is_empty() && !all.is_empty() {
        println!("{name}: measured under valgrind; run {script}");
        std::process::exit(0);
    }
    args
}
