//! Paired ratios: two code paths timed in alternating batches, A then B, B then A, round
//! after round, and the ratio taken within each round.
//!
//! Criterion measures one function after another, seconds apart; on a shared 2-core VM the
//! machine's speed moves between those seconds (other processes, cache state, frequency),
//! and a ratio of two such measurements carries that drift. Batches a few microseconds
//! long, interleaved, see the same machine, so the median of the per-round ratios is the
//! ratio of the two paths' costs. The technique is paired benchmarking (as in the
//! `tango-bench` crate, whose harness needs both paths in one binary built twice; this is
//! the one loop we need, in a few lines).

use std::time::Duration;

/// The result of [`paired`]: `a / b`.
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    /// Median of the per-round ratios.
    pub median: f64,
    /// First and third quartiles of the per-round ratios.
    pub quartiles: (f64, f64),
    /// Mean time of one call of A and of B over all rounds, in ns.
    pub ns: (f64, f64),
    /// Rounds measured.
    pub rounds: usize,
    /// Calls per batch.
    pub batch: u64,
}

impl Ratio {
    /// One line: `label: a/b = median (quartiles ..), A ns / B ns, rounds x batch`.
    pub fn line(&self, label: &str) -> String {
        format!(
            "{label}: paired ratio {:.2}x (quartiles {:.2}-{:.2}x; A {:.1} ns, B {:.1} ns a call; {} rounds of {} calls each)",
            self.median, self.quartiles.0, self.quartiles.1, self.ns.0, self.ns.1, self.rounds, self.batch
        )
    }
}

/// Times `a` and `b` in `rounds` alternating rounds; each closure runs its path `batch`
/// times and returns the elapsed time (so an async path can run inside one `block_on`).
/// One unmeasured round first warms both.
pub fn paired(
    rounds: usize,
    batch: u64,
    mut a: impl FnMut(u64) -> Duration,
    mut b: impl FnMut(u64) -> Duration,
) -> Ratio {
    a(batch);
    b(batch);
    let mut ratios = Vec::with_capacity(rounds);
    let (mut total_a, mut total_b) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        let (ta, tb) = if round % 2 == 0 {
            let ta = a(batch);
            (ta, b(batch))
        } else {
            let tb = b(batch);
            (a(batch), tb)
        };
        ratios.push(ta.as_secs_f64() / tb.as_secs_f64().max(1e-12));
        total_a += ta;
        total_b += tb;
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    let calls = (rounds as u64 * batch).max(1) as f64;
    Ratio {
        median: at(0.5),
        quartiles: (at(0.25), at(0.75)),
        ns: (
            total_a.as_nanos() as f64 / calls,
            total_b.as_nanos() as f64 / calls,
        ),
        rounds,
        batch,
    }
}

/// Rounds and batch size for a path of about `ns` per call: batches of about 50 µs, and
/// 2,000 rounds (`--quick`, about 0.2 s for two 50 µs batches a round), 10,000 (full) or 3
/// (as a test).
pub fn plan(mode: super::Mode, ns: f64) -> (usize, u64) {
    let batch = ((50_000.0 / ns.max(1.0)) as u64).max(1);
    let rounds = match mode {
        super::Mode::Test => 3,
        super::Mode::Quick => 2_000,
        super::Mode::Full => 10_000,
    };
    (rounds, batch)
}
