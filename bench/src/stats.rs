//! Summary statistics of measured samples: mean, sample standard
//! deviation, median and nearest-rank percentiles.
//!
//! Every function takes a slice of `f64` and returns NaN for an empty one
//! rather than panicking: a benchmark cell that produced no sample (every
//! phase filtered out, a contender left out by `--impls`) then prints as a
//! dash or `NaN` instead of aborting the whole run. NaN inputs sort last
//! ([`f64::total_cmp`]), so they never panic either.
//!
//! This file is also included with `#[path]` by the throughput benches'
//! `benches/common/runner.rs` in the root crate (their medians), so it
//! depends on nothing but `std`.

/// Arithmetic mean; NaN when `xs` is empty.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sample standard deviation (n − 1 in the denominator); 0 for a single
/// sample, NaN when `xs` is empty.
pub fn stddev(xs: &[f64]) -> f64 {
    match xs.len() {
        0 => f64::NAN,
        1 => 0.0,
        n => {
            let m = mean(xs);
            (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64).sqrt()
        }
    }
}

/// Median: the middle value, or the mean of the two middle values for an
/// even count; NaN when `xs` is empty.
pub fn median(xs: &[f64]) -> f64 {
    let v = sorted(xs);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `q` quantile (`0.0..=1.0`, clamped) by nearest rank: the sorted
/// value at index `round((len − 1) · q)`; NaN when `xs` is empty.
pub fn percentile(xs: &[f64], q: f64) -> f64 {
    let v = sorted(xs);
    if v.is_empty() {
        return f64::NAN;
    }
    // A NaN `q` stays NaN through the clamp and casts to index 0.
    v[((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn empty_is_nan() {
        assert!(super::mean(&[]).is_nan());
        assert!(super::stddev(&[]).is_nan());
        assert!(super::median(&[]).is_nan());
        assert!(super::percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn median_odd_and_even() {
        assert_eq!(super::median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(super::median(&[7.0]), 7.0);
    }

    #[test]
    fn percentile_nearest_rank() {
        let xs = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(super::percentile(&xs, 0.0), 1.0);
        assert_eq!(super::percentile(&xs, 0.25), 2.0);
        assert_eq!(super::percentile(&xs, 0.75), 4.0);
        assert_eq!(super::percentile(&xs, 1.0), 5.0);
        assert_eq!(super::percentile(&xs, 2.0), 5.0);
    }

    #[test]
    fn mean_and_stddev() {
        assert_eq!(super::mean(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(super::stddev(&[1.0]), 0.0);
        assert!((super::stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) - 2.138).abs() < 1e-3);
    }
}
