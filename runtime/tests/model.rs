//! Model-based tests of the `Store` state machine.
//!
//! proptest generates sequences of operations (claim, takeover, complete, release, renew,
//! abandon, resolve, sleep, purge) by three simulated workers on three keys, runs them
//! against a real store and against the reference model below, and checks every answer,
//! then every record (`lookup`) after every step. A failing case is shrunk to a minimal
//! sequence and printed with the trace of answers up to the failure.
//!
//! Time: `MemoryStore` runs under tokio's paused clock, so lease and expiry boundaries are
//! exact (sleeps of lease - 1 ms, lease, lease + 1 ms). The durable stores run in real time:
//! every operation's "now" is the interval [before, after] it ran in, widened by a small
//! margin, and where a lease or expiry falls inside that interval the model accepts either
//! answer and follows the store. Their TTL is far beyond the test's duration, so only
//! leases are timing-dependent there.
//!
//! Durable backends: `--features sqlite` (a temporary file), `--features redis` with
//! `TOOL_CONTRACTS_REDIS_URL` (and a local Redis Cluster the test starts itself,
//! `tests/support/redis_cluster.rs`), `--features postgres` with
//! `TOOL_CONTRACTS_POSTGRES_URL` (or the servers on their default local ports); without a
//! server the test skips with a visible notice (and fails if `CI` is set): see
//! `tests/support/mod.rs`.

mod conformance;
#[cfg(feature = "redis")]
#[path = "../../tests/support/redis_cluster.rs"]
mod redis_cluster;
#[cfg(any(feature = "redis", feature = "postgres"))]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use tokio::time::Instant;
use tool_contracts_runtime::store::{
    ClaimOutcome, ClaimRequest, Completion, HistoryKind, Record, RecordState, Resolution,
    ResolveRequest, Store, StoreError, StoreResult,
};
use tool_contracts_runtime::MemoryStore;

const WORKERS: u8 = 3;

thread_local! {
    /// How often each kind of answer was seen (per thread: each test runs its cases on its
    /// own thread), so a test can prove the generator reaches every branch of the state
    /// machine: a model that never sees `Abandoned` checks nothing.
    static SEEN: std::cell::RefCell<[u64; 10]> = const { std::cell::RefCell::new([0; 10]) };
}
const ANSWERS: [&str; 10] = [
    "Acquired",
    "InProgress",
    "Abandoned",
    "Completed",
    "fenced Ok",
    "LeaseLost",
    "resolved",
    "NotPending",
    "purged",
    "takeover Acquired",
];

fn seen(i: usize) {
    SEEN.with(|s| s.borrow_mut()[i] += 1);
}
const KEYS: u8 = 3;

/// Which token a worker presents to a fenced operation.
#[derive(Clone, Copy, Debug)]
enum Tok {
    /// The last token this worker received (acquired, or seen abandoned).
    Own,
    /// The last token another worker received.
    Of(u8),
    /// A token no claim was ever given.
    Never,
}

#[derive(Clone, Debug)]
enum Op {
    Claim { w: u8, k: u8 },
    Takeover { w: u8, k: u8, tok: Tok },
    Complete { w: u8, k: u8, tok: Tok, result: u8 },
    Release { w: u8, k: u8, tok: Tok },
    Renew { w: u8, k: u8, tok: Tok },
    Abandon { w: u8, k: u8, tok: Tok },
    Resolve { k: u8, result: Option<u8> },
    Sleep { step: usize },
    Purge,
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        6 => Just(Tok::Own),
        3 => (0..WORKERS).prop_map(Tok::Of),
        1 => Just(Tok::Never),
    ]
}

fn op(sleeps: usize) -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    let k = 0..KEYS;
    prop_oneof![
        8 => (w.clone(), k.clone()).prop_map(|(w, k)| Op::Claim { w, k }),
        3 => (w.clone(), k.clone(), tok()).prop_map(|(w, k, tok)| Op::Takeover { w, k, tok }),
        5 => (w.clone(), k.clone(), tok(), 0..4u8)
            .prop_map(|(w, k, tok, result)| Op::Complete { w, k, tok, result }),
        2 => (w.clone(), k.clone(), tok()).prop_map(|(w, k, tok)| Op::Release { w, k, tok }),
        3 => (w.clone(), k.clone(), tok()).prop_map(|(w, k, tok)| Op::Renew { w, k, tok }),
        2 => (w, k.clone(), tok()).prop_map(|(w, k, tok)| Op::Abandon { w, k, tok }),
        2 => (k, proptest::option::of(0..4u8)).prop_map(|(k, result)| Op::Resolve { k, result }),
        4 => (0..sleeps).prop_map(|step| Op::Sleep { step }),
        1 => Just(Op::Purge),
    ]
}

/// Timing of one backend.
#[derive(Clone, Debug)]
struct Timing {
    lease: Duration,
    ttl: Duration,
    /// Durations a `Sleep` step may take.
    sleeps: Vec<Duration>,
    /// Clock uncertainty added to each side of an operation's interval (0 when paused).
    margin: Duration,
}

/// An instant known to lie within `[lo, hi]`.
#[derive(Clone, Copy, Debug)]
struct Span {
    lo: Instant,
    hi: Instant,
}

impl Span {
    fn plus(self, d: Duration) -> Span {
        Span {
            lo: self.lo + d,
            hi: self.hi + d,
        }
    }
    fn max(self, other: Span) -> Span {
        Span {
            lo: self.lo.max(other.lo),
            hi: self.hi.max(other.hi),
        }
    }
}

/// Whether a deadline has passed at `now`: a store treats `deadline <= now` as passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Passed {
    Yes,
    No,
    Maybe,
}

#[derive(Clone, Debug)]
enum KeyState {
    Free,
    Held {
        token: u64,
        fingerprint: String,
        lease_until: Span,
        expires: Span,
    },
    Done {
        result: String,
        fingerprint: String,
        expires: Span,
    },
}

struct Model {
    timing: Timing,
    keys: Vec<KeyState>,
    /// Per worker and key: the last token the worker received.
    memory: Vec<Vec<Option<u64>>>,
    /// Per key: the highest token any answer carried so far. A new claim must get a higher
    /// one than every key's (`TokenScope::Store`) or than its own key's (`PerKey`).
    max_token: Vec<u64>,
    tokens: TokenScope,
    /// Keys a purge may or may not have deleted (decided by the next lookup).
    maybe_purged: Vec<bool>,
}

impl Model {
    fn new(timing: Timing, tokens: TokenScope) -> Self {
        Model {
            timing,
            keys: vec![KeyState::Free; usize::from(KEYS)],
            memory: vec![vec![None; usize::from(KEYS)]; usize::from(WORKERS)],
            max_token: vec![0; usize::from(KEYS)],
            tokens,
            maybe_purged: vec![false; usize::from(KEYS)],
        }
    }

    /// The token a new claim of key `ki` must exceed.
    fn token_floor(&self, ki: usize) -> u64 {
        match self.tokens {
            TokenScope::Store => self.max_token.iter().copied().max().unwrap_or(0),
            TokenScope::PerKey => self.max_token[ki],
        }
    }

    fn passed(&self, deadline: Span, now: Span) -> Passed {
        let m = self.timing.margin;
        if deadline.hi + m <= now.lo {
            Passed::Yes
        } else if deadline.lo > now.hi + m {
            Passed::No
        } else {
            Passed::Maybe
        }
    }

    fn token(&self, w: u8, k: u8, tok: Tok) -> u64 {
        let of = match tok {
            Tok::Own => w,
            Tok::Of(other) => other,
            Tok::Never => return 0,
        };
        self.memory[usize::from(of)][usize::from(k)].unwrap_or(0)
    }

    fn held(&self, token: u64, w: u8, now: Span) -> KeyState {
        KeyState::Held {
            token,
            fingerprint: fingerprint(w),
            lease_until: now.plus(self.timing.lease),
            expires: now.plus(self.timing.ttl.max(self.timing.lease)),
        }
    }
}

fn fingerprint(w: u8) -> String {
    format!("fp-w{w}")
}

fn args(w: u8) -> String {
    format!("{{\"worker\":{w}}}")
}

/// Which tokens a new claim's token must exceed.
#[derive(Clone, Copy, Debug)]
enum TokenScope {
    /// Every token issued before, for any key: one store-wide counter.
    Store,
    /// Every token issued before for the same key (all `Store` promises): `RedisStore` on
    /// Redis Cluster, one counter per bucket.
    PerKey,
}

/// A store under test, with its own key namespace.
struct Subject<'a> {
    store: &'a dyn Store,
    prefix: String,
    paused: bool,
    tokens: TokenScope,
}

impl Subject<'_> {
    fn key(&self, k: u8) -> String {
        format!("{}/k{k}", self.prefix)
    }
}

fn fail(trace: &str, msg: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!(
        "{msg}\n--- trace (step: op => answer) ---\n{trace}"
    ))
}

macro_rules! ensure {
    ($trace:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(fail(&$trace, format!($($msg)+)));
        }
    };
}

/// Checks a claim-like answer against the model and applies it. `stale` is `Some` for a
/// takeover presenting that token.
fn check_claim(
    model: &mut Model,
    trace: &str,
    w: u8,
    k: u8,
    stale: Option<u64>,
    now: Span,
    answer: ClaimOutcome,
) -> Result<(), TestCaseError> {
    let ki = usize::from(k);
    let state = model.keys[ki].clone();
    let acquired_ok: bool;
    match &state {
        KeyState::Free => acquired_ok = true,
        KeyState::Held {
            token,
            fingerprint,
            lease_until,
            ..
        } => {
            let passed = model.passed(*lease_until, now);
            let takes = stale == Some(*token);
            match &answer {
                ClaimOutcome::Acquired { .. } => {
                    ensure!(
                        trace,
                        takes && passed != Passed::No,
                        "k{k}: Acquired, but it is held by token {token} (lease passed: {passed:?}, presented {stale:?})"
                    );
                }
                ClaimOutcome::InProgress {
                    fingerprint: f,
                    lease_remaining,
                } => {
                    ensure!(
                        trace,
                        passed != Passed::Yes,
                        "k{k}: InProgress after the lease ran out"
                    );
                    ensure!(
                        trace,
                        f == fingerprint,
                        "k{k}: holder fingerprint {f}, model {fingerprint}"
                    );
                    if model.timing.margin.is_zero() {
                        let expect = lease_until.lo - now.lo;
                        ensure!(
                            trace,
                            *lease_remaining == expect,
                            "k{k}: lease_remaining {lease_remaining:?}, model {expect:?}"
                        );
                    } else {
                        ensure!(
                            trace,
                            *lease_remaining <= model.timing.lease + model.timing.margin,
                            "k{k}: lease_remaining {lease_remaining:?} exceeds the lease"
                        );
                    }
                }
                ClaimOutcome::Abandoned {
                    token: t,
                    fingerprint: f,
                } => {
                    ensure!(
                        trace,
                        passed != Passed::No,
                        "k{k}: Abandoned while the lease is live"
                    );
                    ensure!(
                        trace,
                        !(takes && passed == Passed::Yes),
                        "k{k}: takeover with the stale token {t} answered Abandoned"
                    );
                    ensure!(
                        trace,
                        t == token && f == fingerprint,
                        "k{k}: Abandoned {{{t}, {f}}}, model {{{token}, {fingerprint}}}"
                    );
                    model.memory[usize::from(w)][ki] = Some(*t);
                }
                ClaimOutcome::Completed(r) => {
                    return Err(fail(trace, format!("k{k}: Completed while held: {r:?}")));
                }
            }
            acquired_ok = takes;
        }
        KeyState::Done {
            result,
            fingerprint,
            expires,
        } => {
            let passed = model.passed(*expires, now);
            match &answer {
                ClaimOutcome::Acquired { .. } => {
                    ensure!(
                        trace,
                        passed != Passed::No,
                        "k{k}: Acquired over a live result"
                    );
                }
                ClaimOutcome::Completed(r) => {
                    ensure!(
                        trace,
                        passed != Passed::Yes,
                        "k{k}: an expired result was returned"
                    );
                    check_done(trace, k, r, result, fingerprint)?;
                }
                other => return Err(fail(trace, format!("k{k}: {other:?} for a completed key"))),
            }
            acquired_ok = true;
        }
    }
    seen(match (&answer, stale) {
        (ClaimOutcome::Acquired { .. }, Some(_)) => 9,
        (ClaimOutcome::Acquired { .. }, None) => 0,
        (ClaimOutcome::InProgress { .. }, _) => 1,
        (ClaimOutcome::Abandoned { .. }, _) => 2,
        (ClaimOutcome::Completed(_), _) => 3,
    });
    if let ClaimOutcome::Acquired { token } = answer {
        ensure!(trace, acquired_ok, "k{k}: Acquired unexpectedly");
        let floor = model.token_floor(ki);
        ensure!(
            trace,
            token > floor,
            "k{k}: token {token} is not above every earlier token ({floor}, {:?})",
            model.tokens
        );
        model.max_token[ki] = token;
        model.memory[usize::from(w)][ki] = Some(token);
        model.keys[ki] = model.held(token, w, now);
    }
    Ok(())
}

fn check_done(
    trace: &str,
    k: u8,
    r: &Record,
    result: &str,
    fingerprint: &str,
) -> Result<(), TestCaseError> {
    match &r.state {
        RecordState::Completed {
            result: got,
            is_error,
            ..
        } => {
            ensure!(
                trace,
                got == result && !is_error,
                "k{k}: result {got:?} (error {is_error}), model {result:?}"
            );
        }
        other => {
            return Err(fail(
                trace,
                format!("k{k}: record state {other:?}, model completed"),
            ))
        }
    }
    ensure!(
        trace,
        r.fingerprint == fingerprint,
        "k{k}: record fingerprint {}, model {fingerprint}",
        r.fingerprint
    );
    Ok(())
}

/// A fenced operation's answer: `Ok` iff the presented token holds the key (and, for a
/// renewal, its lease is live).
fn check_fenced(
    model: &Model,
    trace: &str,
    k: u8,
    token: u64,
    needs_live_lease: bool,
    now: Span,
    answer: &Result<(), StoreError>,
) -> Result<bool, TestCaseError> {
    let (holds, passed) = match &model.keys[usize::from(k)] {
        KeyState::Held {
            token: t,
            lease_until,
            ..
        } if *t == token => (true, model.passed(*lease_until, now)),
        _ => (false, Passed::No),
    };
    let may_succeed = holds && (!needs_live_lease || passed != Passed::Yes);
    let may_fail = !holds || (needs_live_lease && passed != Passed::No);
    match answer {
        Ok(()) => {
            seen(4);
            ensure!(
                trace,
                may_succeed,
                "k{k}: token {token} succeeded but does not hold the key (fencing)"
            );
            Ok(true)
        }
        Err(StoreError::LeaseLost { token: t }) => {
            seen(5);
            ensure!(
                trace,
                *t == token,
                "k{k}: LeaseLost names token {t}, presented {token}"
            );
            ensure!(
                trace,
                may_fail,
                "k{k}: token {token} holds the key but got LeaseLost"
            );
            Ok(false)
        }
        Err(e) => Err(fail(trace, format!("k{k}: unexpected error {e:?}"))),
    }
}

async fn now_span<F: std::future::Future>(fut: F) -> (F::Output, Span) {
    let lo = Instant::now();
    let out = fut.await;
    let hi = Instant::now();
    (out, Span { lo, hi })
}

/// Runs `ops` against `subject` and the model; `Err` carries the trace.
async fn run_case(subject: &Subject<'_>, timing: &Timing, ops: &[Op]) -> Result<(), TestCaseError> {
    let store = subject.store;
    let mut model = Model::new(timing.clone(), subject.tokens);
    let mut trace = String::new();
    for (step, op) in ops.iter().enumerate() {
        let _ = write!(trace, "{step:>3}: {op:?} => ");
        match *op {
            Op::Claim { w, k } | Op::Takeover { w, k, .. } => {
                let key = subject.key(k);
                let (fp, a) = (fingerprint(w), args(w));
                let req = ClaimRequest {
                    key: &key,
                    tool: "model_tool",
                    version: 1,
                    scope: None,
                    fingerprint: &fp,
                    args: &a,
                    lease: timing.lease,
                    ttl: timing.ttl,
                    worker: "model-worker",
                };
                let stale = match *op {
                    Op::Takeover { tok, .. } => Some(model.token(w, k, tok)),
                    _ => None,
                };
                let (answer, now) = match stale {
                    Some(t) => now_span(store.takeover(req, t)).await,
                    None => now_span(store.claim(req)).await,
                };
                let _ = writeln!(trace, "{answer:?}");
                let answer = answer.map_err(|e| fail(&trace, format!("store error: {e}")))?;
                check_claim(&mut model, &trace, w, k, stale, now, answer)?;
            }
            Op::Complete { w, k, tok, result } => {
                let key = subject.key(k);
                let token = model.token(w, k, tok);
                let text = result.to_string();
                let done = Completion {
                    result: &text,
                    is_error: false,
                    ttl: timing.ttl,
                };
                let (answer, now) = now_span(store.complete(&key, token, done)).await;
                let _ = writeln!(trace, "token {token}: {answer:?}");
                if check_fenced(&model, &trace, k, token, false, now, &answer)? {
                    let ki = usize::from(k);
                    let KeyState::Held { fingerprint, .. } = model.keys[ki].clone() else {
                        unreachable!("checked above")
                    };
                    model.keys[ki] = KeyState::Done {
                        result: text,
                        fingerprint,
                        expires: now.plus(timing.ttl),
                    };
                }
            }
            Op::Release { w, k, tok } => {
                let token = model.token(w, k, tok);
                let (answer, now) = now_span(store.release(&subject.key(k), token)).await;
                let _ = writeln!(trace, "token {token}: {answer:?}");
                if check_fenced(&model, &trace, k, token, false, now, &answer)? {
                    model.keys[usize::from(k)] = KeyState::Free;
                }
            }
            Op::Abandon { w, k, tok } => {
                let token = model.token(w, k, tok);
                let (answer, now) = now_span(store.abandon(&subject.key(k), token)).await;
                let _ = writeln!(trace, "token {token}: {answer:?}");
                if check_fenced(&model, &trace, k, token, false, now, &answer)? {
                    if let KeyState::Held { lease_until, .. } = &mut model.keys[usize::from(k)] {
                        *lease_until = now;
                    }
                }
            }
            Op::Renew { w, k, tok } => {
                let token = model.token(w, k, tok);
                let (answer, now) =
                    now_span(store.renew(&subject.key(k), token, timing.lease)).await;
                let _ = writeln!(trace, "token {token}: {answer:?}");
                if check_fenced(&model, &trace, k, token, true, now, &answer)? {
                    if let KeyState::Held {
                        lease_until,
                        expires,
                        ..
                    } = &mut model.keys[usize::from(k)]
                    {
                        *lease_until = now.plus(timing.lease);
                        *expires = expires.max(*lease_until);
                    }
                }
            }
            Op::Resolve { k, result } => {
                let text = result.map(|r| format!("\"resolved-{r}\""));
                let resolution = match &text {
                    Some(t) => Resolution::Complete {
                        result: t,
                        ttl: timing.ttl,
                    },
                    None => Resolution::Release,
                };
                let (answer, now) = now_span(store.resolve(ResolveRequest {
                    key: &subject.key(k),
                    resolution,
                    kind: HistoryKind::Resolved,
                    worker: "operator",
                }))
                .await;
                let _ = writeln!(trace, "{answer:?}");
                let ki = usize::from(k);
                match (&model.keys[ki].clone(), answer) {
                    (KeyState::Held { fingerprint, .. }, Ok(())) => {
                        seen(6);
                        model.keys[ki] = match text {
                            Some(result) => KeyState::Done {
                                result,
                                fingerprint: fingerprint.clone(),
                                expires: now.plus(timing.ttl),
                            },
                            None => KeyState::Free,
                        };
                    }
                    (KeyState::Free | KeyState::Done { .. }, Err(StoreError::NotPending)) => {
                        seen(7)
                    }
                    (state, answer) => {
                        return Err(fail(
                            &trace,
                            format!("k{k}: resolve answered {answer:?} for {state:?}"),
                        ))
                    }
                }
            }
            Op::Sleep { step } => {
                let d = timing.sleeps[step % timing.sleeps.len()];
                tokio::time::sleep(d).await;
                let _ = writeln!(trace, "slept {d:?}");
            }
            Op::Purge => {
                let (answer, now) = now_span(store.purge_expired()).await;
                let _ = writeln!(trace, "{answer:?}");
                let purged = answer.map_err(|e| fail(&trace, format!("store error: {e}")))?;
                if purged > 0 {
                    seen(8);
                }
                let (mut sure, mut maybe) = (0u64, 0u64);
                for ki in 0..usize::from(KEYS) {
                    let expires = match &model.keys[ki] {
                        KeyState::Free => continue,
                        KeyState::Held { expires, .. } | KeyState::Done { expires, .. } => *expires,
                    };
                    match model.passed(expires, now) {
                        Passed::Yes => {
                            sure += 1;
                            model.keys[ki] = KeyState::Free;
                        }
                        Passed::Maybe => {
                            maybe += 1;
                            model.maybe_purged[ki] = true;
                        }
                        Passed::No => {}
                    }
                }
                // Other runs' keys may share a durable store: only the memory store's count
                // is exactly ours.
                if subject.paused {
                    ensure!(
                        trace,
                        purged >= sure && purged <= sure + maybe,
                        "purged {purged}, model {sure}..={}",
                        sure + maybe
                    );
                }
            }
        }
        sync(subject, &mut model, &trace).await?;
    }
    Ok(())
}

/// Every record matches the model (`lookup`), resolving what a purge left undecided.
async fn sync(subject: &Subject<'_>, model: &mut Model, trace: &str) -> Result<(), TestCaseError> {
    for k in 0..KEYS {
        let ki = usize::from(k);
        let record = subject
            .store
            .lookup(&subject.key(k))
            .await
            .map_err(|e| fail(trace, format!("lookup: {e}")))?;
        if std::mem::take(&mut model.maybe_purged[ki]) && record.is_none() {
            model.keys[ki] = KeyState::Free;
        }
        match (&model.keys[ki], &record) {
            (KeyState::Free, None) => {}
            (
                KeyState::Held {
                    token, fingerprint, ..
                },
                Some(r),
            ) => {
                let ok = matches!(r.state, RecordState::InProgress { token: t, .. } if t == *token);
                ensure!(
                    trace,
                    ok && &r.fingerprint == fingerprint,
                    "k{k}: record {r:?}, model held by {token} ({fingerprint})"
                );
                ensure!(
                    trace,
                    r.args == args_of(fingerprint),
                    "k{k}: args {}",
                    r.args
                );
            }
            (
                KeyState::Done {
                    result,
                    fingerprint,
                    ..
                },
                Some(r),
            ) => check_done(trace, k, r, result, fingerprint)?,
            (state, record) => {
                return Err(fail(
                    trace,
                    format!("k{k}: record {record:?}, model {state:?}"),
                ))
            }
        }
    }
    Ok(())
}

fn args_of(fingerprint: &str) -> String {
    let w: u8 = fingerprint
        .trim_start_matches("fp-w")
        .parse()
        .unwrap_or(u8::MAX);
    args(w)
}

// ---------------------------------------------------------------------------------------
// MemoryStore: exact timing under tokio's paused clock.
// ---------------------------------------------------------------------------------------

fn memory_timing() -> Timing {
    let ms = Duration::from_millis;
    Timing {
        lease: ms(1000),
        ttl: ms(5000),
        sleeps: vec![
            ms(0),
            ms(1),
            ms(333),
            ms(999),
            ms(1000),
            ms(1001),
            ms(2500),
            ms(6000),
        ],
        margin: Duration::ZERO,
    }
}

/// Runs `cases` generated cases under tokio's paused clock, each against a fresh store
/// from `make`.
fn run_paused<S: Store>(
    cases: u32,
    prefix: &str,
    make: impl Fn() -> S,
) -> Result<(), TestError<Vec<Op>>> {
    let timing = memory_timing();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(op(timing.sleeps.len()), 1..60);
    runner.run(&strategy, |ops| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let store = make();
        let subject = Subject {
            store: &store,
            prefix: prefix.to_owned(),
            paused: true,
            tokens: TokenScope::Store,
        };
        rt.block_on(run_case(&subject, &timing, &ops))
    })
}

/// How often each kind of answer was checked on this thread, printed after `what`.
fn answers_checked(what: &str) -> Vec<(&'static str, u64)> {
    let counts: Vec<(&str, u64)> =
        SEEN.with(|s| ANSWERS.iter().copied().zip(*s.borrow()).collect());
    eprintln!("{what}; answers checked: {counts:?}");
    counts
}

#[test]
fn memory_store_matches_the_model() {
    let cases: u32 = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    if let Err(e) = run_paused(cases, "mem", MemoryStore::new) {
        panic!("MemoryStore diverged from the model (minimal case after shrinking):\n{e}");
    }
    for (name, n) in answers_checked(&format!("{cases} cases")) {
        assert!(
            n > 0,
            "the generator never produced a `{name}` answer: the model is not exercised"
        );
    }
}

/// The model itself catches a store that breaks fencing: a store that lets any token
/// complete must fail the run.
#[test]
fn the_model_catches_a_store_without_fencing() {
    struct Unfenced(MemoryStore);
    #[async_trait::async_trait]
    impl Store for Unfenced {
        async fn claim(&self, r: ClaimRequest<'_>) -> StoreResult<ClaimOutcome> {
            self.0.claim(r).await
        }
        async fn takeover(&self, r: ClaimRequest<'_>, t: u64) -> StoreResult<ClaimOutcome> {
            self.0.takeover(r, t).await
        }
        async fn complete(&self, key: &str, token: u64, c: Completion<'_>) -> StoreResult {
            // Broken: completes under whatever token holds the key.
            match self.0.lookup(key).await? {
                Some(Record {
                    state: RecordState::InProgress { token: holder, .. },
                    ..
                }) => self.0.complete(key, holder, c).await,
                _ => Err(StoreError::LeaseLost { token }),
            }
        }
        async fn release(&self, key: &str, token: u64) -> StoreResult {
            self.0.release(key, token).await
        }
        async fn renew(&self, key: &str, token: u64, lease: Duration) -> StoreResult {
            self.0.renew(key, token, lease).await
        }
        async fn abandon(&self, key: &str, token: u64) -> StoreResult {
            self.0.abandon(key, token).await
        }
        async fn lookup(&self, key: &str) -> StoreResult<Option<Record>> {
            self.0.lookup(key).await
        }
        async fn pending(&self, limit: usize) -> StoreResult<Vec<Record>> {
            self.0.pending(limit).await
        }
        async fn resolve(&self, r: ResolveRequest<'_>) -> StoreResult {
            self.0.resolve(r).await
        }
        async fn history(
            &self,
            key: &str,
        ) -> StoreResult<Vec<tool_contracts_runtime::store::HistoryEvent>> {
            self.0.history(key).await
        }
        async fn purge_expired(&self) -> StoreResult<u64> {
            self.0.purge_expired().await
        }
    }
    let result = run_paused(256, "unfenced", || Unfenced(MemoryStore::new()));
    let err = result.expect_err("an unfenced store must diverge from the model");
    let text = err.to_string();
    eprintln!("the reproduction a failing store gets:\n{text}");
    assert!(text.contains("fencing"), "{text}");
    // Shrinking yields a short reproduction: claim, something that stales the token, complete.
    let steps = text
        .lines()
        .filter(|l| {
            l.contains(": ")
                && l.trim_start()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
        })
        .count();
    assert!(steps <= 6, "not minimal ({steps} steps):\n{text}");
}

// ---------------------------------------------------------------------------------------
// Durable stores: real time, interval model.
// ---------------------------------------------------------------------------------------

#[allow(dead_code)]
fn durable_timing() -> Timing {
    let ms = Duration::from_millis;
    Timing {
        lease: ms(200),
        ttl: Duration::from_secs(3600),
        sleeps: vec![ms(0), ms(20), ms(150), ms(450)],
        margin: ms(15),
    }
}

#[allow(dead_code)]
fn durable_cases() -> u32 {
    std::env::var("MODEL_DURABLE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

/// Runs the model against a durable store (real time), each case under a fresh prefix.
#[allow(dead_code)]
fn run_durable(name: &str, rt: &tokio::runtime::Runtime, store: &dyn Store) {
    run_durable_with(name, rt, store, TokenScope::Store);
}

/// [`run_durable`] for a store whose tokens rise per key (`tokens`).
#[allow(dead_code)]
fn run_durable_with(
    name: &str,
    rt: &tokio::runtime::Runtime,
    store: &dyn Store,
    tokens: TokenScope,
) {
    let timing = durable_timing();
    let mut runner = TestRunner::new(Config {
        cases: durable_cases(),
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(op(timing.sleeps.len()), 1..30);
    let run = conformance::unique(&format!("model-{name}"));
    let case = std::cell::Cell::new(0u64);
    let result = runner.run(&strategy, |ops| {
        case.set(case.get() + 1);
        let subject = Subject {
            store,
            prefix: format!("{run}-{}", case.get()),
            paused: false,
            tokens,
        };
        rt.block_on(run_case(&subject, &timing, &ops))
    });
    if let Err(e) = result {
        panic!("{name} diverged from the model (minimal case after shrinking):\n{e}");
    }
    let counts = answers_checked(&format!("{name}: {} cases", durable_cases()));
    // Real time decides how often leases run out, so only the common answers are required.
    for (name, n) in &counts[..6] {
        assert!(*n > 0, "the generator never produced a `{name}` answer");
    }
}

#[allow(dead_code)]
fn real_time_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_store_matches_the_model() {
    let rt = real_time_runtime();
    let dir = std::env::temp_dir().join(conformance::unique("tool-contracts-model"));
    std::fs::create_dir_all(&dir).unwrap();
    let store = rt
        .block_on(tool_contracts_runtime::store::SqliteStore::open(
            dir.join("model.db"),
        ))
        .unwrap();
    run_durable("sqlite", &rt, &store);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "redis")]
#[test]
fn redis_store_matches_the_model() {
    let Some(url) = support::url(&support::REDIS, "the Redis model test") else {
        return;
    };
    let rt = real_time_runtime();
    let prefix = format!("{}:", conformance::unique("model"));
    let store = rt
        .block_on(tool_contracts_runtime::store::RedisStore::with_prefix(
            &url, &prefix,
        ))
        .unwrap();
    run_durable("redis", &rt, &store);
}

/// The same on a local Redis Cluster of three primaries (started by the test): the keys
/// of a case fall in different buckets, so mostly on different primaries, and each
/// bucket has a fencing counter of its own, so tokens must rise per key only.
#[cfg(feature = "redis")]
#[test]
fn redis_cluster_store_matches_the_model() {
    let Some(cluster) = redis_cluster::LocalCluster::shared("the Redis Cluster model test") else {
        return;
    };
    let rt = real_time_runtime();
    let prefix = format!("{}:", conformance::unique("model"));
    let store = rt
        .block_on(
            tool_contracts_runtime::store::RedisStore::cluster_builder(cluster.node_urls())
                .prefix(&prefix)
                .allow_without_persistence()
                .connect(),
        )
        .unwrap();
    // One fencing counter per bucket: tokens rise per key, not store-wide.
    run_durable_with("redis-cluster", &rt, &store, TokenScope::PerKey);
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_store_matches_the_model() {
    let Some(url) = support::url(&support::POSTGRES, "the PostgreSQL model test") else {
        return;
    };
    let rt = real_time_runtime();
    let store = rt
        .block_on(tool_contracts_runtime::store::PostgresStore::connect(&url))
        .unwrap();
    run_durable("postgres", &rt, &store);
}
