//! The rows a benchmark adds to the one table `scripts/bench` prints: appended, tab-separated,
//! to the file `BERTH_BENCH_TABLE` names (nothing when it is unset, as when run by hand).

use std::io::Write;

/// One row: what was measured, its value, the baseline it is judged against and their ratio
/// ("-" when there is none), the target and whether it was met.
pub fn row(measure: &str, value: &str, baseline: &str, ratio: &str, target: &str, result: &str) {
    let Some(path) = std::env::var_os("BERTH_BENCH_TABLE") else {
        return;
    };
    let line = [measure, value, baseline, ratio, target, result].join("\t");
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut file| writeln!(file, "{line}"));
    if let Err(e) = written {
        eprintln!("cannot add a row to {}: {e}", path.to_string_lossy());
    }
}
