//! Issue item 1: key derivation against the hand-rolled way and against the floor.
//!
//! - `ours`: `KeyBuilder` (what `#[mutating_tool]` expands to): streaming RFC 8785 encoder
//!   straight from the typed arguments, then SHA-256 and lowercase hex.
//! - `hand_rolled`: `serde_json::to_vec` of a `json!` map (sorted keys; serde_json's
//!   default map is a `BTreeMap`, and the members are inserted in order anyway), then
//!   SHA-256 and hex. Not canonical for floats, big integers or non-BMP key order, which
//!   is why the project does not do this; it is the "obvious" baseline.
//! - `floor_sha256`: SHA-256 of the same canonical bytes (already built), no encoding.
//! - `floor_sha256_hex`: the floor plus the same hex encoding the key needs.
//!
//! Run: `cargo bench -p tool-contracts-benches --bench key_derivation` (add `-- --quick` for a
//! short run).

#[allow(dead_code)]
#[path = "common/mod.rs"]
mod common;

#[path = "common/big_cart.rs"]
mod big_cart;

use std::hint::black_box;
use std::time::Instant;

use big_cart::{big_cart, Cart};
use criterion::{BenchmarkId, Criterion, Throughput};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tool_contracts::key::{KeyBuilder, TOOL_KEY_CONTRACT};

/// The same shapes with their fields declared in JCS (sorted) order: the canonical
/// encoder then never reorders members. Same canonical bytes as `Line`/`Cart`.
#[derive(Serialize, Clone)]
struct SortedLine {
    note: String,
    price_cents: u64,
    qty: u32,
    sku: String,
}

#[derive(Serialize, Clone)]
struct SortedCart {
    currency: String,
    id: String,
    lines: Vec<SortedLine>,
}

fn sorted(cart: &Cart) -> SortedCart {
    SortedCart {
        currency: cart.currency.clone(),
        id: cart.id.clone(),
        lines: cart
            .lines
            .iter()
            .map(|l| SortedLine {
                note: l.note.clone(),
                price_cents: l.price_cents,
                qty: l.qty,
                sku: l.sku.clone(),
            })
            .collect(),
    }
}

/// Lowercase hex through a 16-entry table, so the floor is not slowed by `format!`
/// machinery. (The runtime's keys use `const-hex`, SIMD, since 6e3d97e: this row is a
/// plain table's hex, not the runtime's.)
fn hex(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

/// The key as `#[mutating_tool(idempotency_key_fields = [amount_cents, cart.id, user_id])]`
/// derives it: the members' names and the document's end come encoded at compile time
/// (`field_member`, `finish_tail`).
fn ours_small(user_id: u64, cart_id: &str, amount: u64) -> String {
    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
    k.field_member("\"amount_cents\":", "amount_cents", &amount)
        .expect("field");
    k.field_member("\"cart.id\":", "cart.id", cart_id)
        .expect("field");
    k.field_member("\"user_id\":", "user_id", &user_id)
        .expect("field");
    k.finish_tail(None, SMALL_TAIL, "create_order", 1)
}

/// The end of `create_order`'s key document, as the macro writes it out.
const SMALL_TAIL: &str = ",\"tool\":\"create_order\",\"version\":1}";

/// The same key through the public builder, names given as paths (what code that builds
/// keys by hand, and `tool_key`, pay).
fn ours_small_by_path(user_id: u64, cart_id: &str, amount: u64) -> String {
    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
    k.field("amount_cents", &amount).expect("field");
    k.field("cart.id", cart_id).expect("field");
    k.field("user_id", &user_id).expect("field");
    k.finish(None, "create_order", 1)
}

fn hand_small(user_id: u64, cart_id: &str, amount: u64) -> String {
    let doc = json!({
        "contract": TOOL_KEY_CONTRACT,
        "fields": { "amount_cents": amount, "cart.id": cart_id, "user_id": user_id },
        "scope": null,
        "tool": "create_order",
        "version": 1,
    });
    let bytes = serde_json::to_vec(&doc).expect("json");
    hex(&Sha256::digest(&bytes))
}

/// As the macro derives it (see [`ours_small`]).
fn ours_big<C: Serialize>(user_id: u64, cart: &C) -> String {
    let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
    k.field_member("\"cart\":", "cart", cart).expect("field");
    k.field_member("\"user_id\":", "user_id", &user_id)
        .expect("field");
    k.finish_tail(None, SMALL_TAIL, "create_order", 1)
}

fn hand_big(user_id: u64, cart: &Cart) -> String {
    let doc = json!({
        "contract": TOOL_KEY_CONTRACT,
        "fields": { "cart": cart, "user_id": user_id },
        "scope": null,
        "tool": "create_order",
        "version": 1,
    });
    let bytes = serde_json::to_vec(&doc).expect("json");
    hex(&Sha256::digest(&bytes))
}

fn bench(c: &mut Criterion) {
    common::print_machine("key_derivation");
    let cart = big_cart();

    // The canonical documents, for the floor, and a sanity check that both ways agree on
    // these inputs (they do: only ASCII keys, no floats, small integers).
    let small_doc = {
        let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
        k.field("amount_cents", &4999_u64).expect("field");
        k.field("cart.id", "c-42").expect("field");
        k.field("user_id", &7_u64).expect("field");
        k.finish_document(None, "create_order", 1)
    };
    let big_doc = {
        let mut k = KeyBuilder::new(TOOL_KEY_CONTRACT);
        k.field("cart", &cart).expect("field");
        k.field("user_id", &7_u64).expect("field");
        k.finish_document(None, "create_order", 1)
    };
    assert_eq!(SMALL_TAIL, tool_contracts::key::key_tail("create_order", 1));
    assert_eq!(ours_small(7, "c-42", 4999), hand_small(7, "c-42", 4999));
    assert_eq!(
        ours_small(7, "c-42", 4999),
        ours_small_by_path(7, "c-42", 4999)
    );
    assert_eq!(ours_big(7, &cart), hand_big(7, &cart));
    let sorted_cart = sorted(&cart);
    assert_eq!(ours_big(7, &sorted_cart), ours_big(7, &cart));
    assert_eq!(
        ours_small(7, "c-42", 4999),
        hex(&Sha256::digest(&small_doc))
    );
    println!(
        "canonical document sizes: small {} bytes, big {} bytes",
        small_doc.len(),
        big_doc.len()
    );

    let mut g = c.benchmark_group("key/3-field");
    g.throughput(Throughput::Bytes(small_doc.len() as u64));
    g.bench_function("ours", |b| {
        b.iter(|| ours_small(black_box(7), black_box("c-42"), black_box(4999)));
    });
    g.bench_function("ours_by_path", |b| {
        b.iter(|| ours_small_by_path(black_box(7), black_box("c-42"), black_box(4999)));
    });
    g.bench_function("hand_rolled", |b| {
        b.iter(|| hand_small(black_box(7), black_box("c-42"), black_box(4999)));
    });
    g.bench_function("floor_sha256", |b| {
        b.iter(|| Sha256::digest(black_box(&small_doc)));
    });
    g.bench_function("floor_sha256_hex", |b| {
        b.iter(|| hex(&Sha256::digest(black_box(&small_doc))));
    });
    g.finish();

    let mut g = c.benchmark_group("key/4KiB-arg");
    g.throughput(Throughput::Bytes(big_doc.len() as u64));
    g.bench_function("ours", |b| {
        b.iter(|| ours_big(black_box(7), black_box(&cart)))
    });
    g.bench_function("ours_fields_declared_sorted", |b| {
        b.iter(|| ours_big(black_box(7), black_box(&sorted_cart)));
    });
    g.bench_function("hand_rolled", |b| {
        b.iter(|| hand_big(black_box(7), black_box(&cart)));
    });
    g.bench_function("floor_sha256", |b| {
        b.iter(|| Sha256::digest(black_box(&big_doc)));
    });
    g.bench_function("floor_sha256_hex", |b| {
        b.iter(|| hex(&Sha256::digest(black_box(&big_doc))));
    });
    // What a call of a tool whose key field is the 4 KiB cart pays in all: the key, plus
    // the argument fingerprint (`CallBuilder::arg`: canonical bytes again + SHA-256).
    g.bench_with_input(
        BenchmarkId::new("ours_key_plus_fingerprint", "cart"),
        &cart,
        |b, cart| {
            b.iter(|| {
                let key = ours_big(7, cart);
                let mut scratch = Vec::new();
                tool_contracts::key::write_canonical(cart, &mut scratch).expect("json");
                (key, Sha256::digest(&scratch))
            });
        },
    );
    g.finish();

    // The same ratios measured paired (`common/paired.rs`): ours and the floor in
    // alternating batches, so the machine's drift between criterion's separate
    // measurements does not enter the ratio.
    let mode = common::Mode::detect();
    let time = |n: u64, f: &dyn Fn()| {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        start.elapsed()
    };
    let small = |n| {
        time(n, &|| {
            black_box(ours_small(black_box(7), black_box("c-42"), black_box(4999)));
        })
    };
    let small_floor = |n| {
        time(n, &|| {
            black_box(Sha256::digest(black_box(&small_doc)));
        })
    };
    let (rounds, batch) = common::paired::plan(mode, 400.0);
    let r = common::paired::paired(rounds, batch, small, small_floor);
    println!("{}", r.line("key/3-field ours / floor_sha256"));
    let big = |n| {
        time(n, &|| {
            black_box(ours_big(black_box(7), black_box(&cart)));
        })
    };
    let big_floor = |n| {
        time(n, &|| {
            black_box(Sha256::digest(black_box(&big_doc)));
        })
    };
    let (rounds, batch) = common::paired::plan(mode, 15_000.0);
    let r = common::paired::paired(rounds, batch, big, big_floor);
    println!("{}", r.line("key/4KiB-arg ours / floor_sha256"));
}

fn main() {
    common::criterion_main(bench);
}
