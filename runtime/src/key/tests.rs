//! Unit tests of the key module: the writer against RFC 8785's examples and against a
//! naive JCS reference written independently below, the serde data model against
//! `serde_json::to_value`, and the key spec's own rules (empty and inexact key fields,
//! field order, the digest).

use core::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::serializer::{SERDE_JSON_NUMBER_TOKEN, SERDE_JSON_RAW_TOKEN};
use super::*;

/// `write_canonical` of `value`, as text.
fn canonical<T: ?Sized + Serialize>(value: &T) -> Result<String, CanonicalError> {
    let mut out = Vec::new();
    write_canonical(value, &mut out)?;
    Ok(String::from_utf8(out).expect("canonical JSON is UTF-8"))
}

/// `write_canonical_exact` of `value` (the key fields' number rule), as text.
fn exact<T: ?Sized + Serialize>(value: &T) -> Result<String, CanonicalError> {
    let mut out = Vec::new();
    write_canonical_exact(value, &mut out)?;
    Ok(String::from_utf8(out).expect("canonical JSON is UTF-8"))
}

/// `write_canonical` of a value that must encode.
fn canon<T: ?Sized + Serialize>(value: &T) -> String {
    canonical(value).expect("value encodes")
}

/// An object-safe view of a `Serialize` value, so that differently typed values can stand
/// in one table of cases.
trait Case {
    /// [`canonical`] of the value.
    fn canonical(&self) -> Result<String, CanonicalError>;
    /// [`exact`] of the value.
    fn exact(&self) -> Result<String, CanonicalError>;
    /// `serde_json::to_value` of the value.
    fn to_value(&self) -> Value;
    /// Adds the value to `builder` as the key field `path`.
    fn add(&self, builder: &mut KeyBuilder, path: &str) -> Result<(), KeyFieldError>;
}

impl<T: Serialize> Case for T {
    fn canonical(&self) -> Result<String, CanonicalError> {
        canonical(self)
    }

    fn exact(&self) -> Result<String, CanonicalError> {
        exact(self)
    }

    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("to_value")
    }

    fn add(&self, builder: &mut KeyBuilder, path: &str) -> Result<(), KeyFieldError> {
        builder.field(path, self)
    }
}

// -----------------------------------------------------------------------------------
// An independent reference: JCS over `serde_json::Value`, written naively (UTF-16 key
// vectors, per-char escaping, and ECMAScript number formatting derived from Rust's
// shortest `{:e}` output rather than from ryu-js).
// -----------------------------------------------------------------------------------

fn ref_number(f: f64) -> String {
    assert!(f.is_finite());
    if f == 0.0 {
        return "0".to_owned();
    }
    let sign = if f < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digit count k; `{:.(k-1)e}` then gives the
    // k-digit decimal nearest to f, ties to even (as ECMA-262 Number::toString wants;
    // the shortest-digits mode alone does not break ties to even).
    let shortest = format!("{:e}", f.abs());
    let (mantissa, _) = shortest.split_once('e').expect("exponent");
    let k = mantissa.chars().filter(char::is_ascii_digit).count();
    let sci = format!("{:.*e}", k - 1, f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let digits = digits.trim_end_matches('0');
    let k = digits.len() as i32;
    let n = exp + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let e = if e >= 0 {
            format!("+{e}")
        } else {
            e.to_string()
        };
        if k == 1 {
            format!("{digits}e{e}")
        } else {
            format!("{}.{}e{e}", &digits[..1], &digits[1..])
        }
    };
    format!("{sign}{body}")
}

fn ref_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn ref_integer(negative: bool, magnitude: u64) -> String {
    let text = if negative {
        format!("-{magnitude}")
    } else {
        magnitude.to_string()
    };
    if magnitude > 9_007_199_254_740_991 {
        format!("\"{text}\"")
    } else {
        text
    }
}

fn reference(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                ref_integer(false, u)
            } else if let Some(i) = n.as_i64() {
                ref_integer(i < 0, i.unsigned_abs())
            } else {
                ref_number(n.as_f64().expect("float"))
            }
        }
        Value::String(s) => ref_string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(reference).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(map) => {
            let mut members: Vec<(Vec<u16>, String)> = map
                .iter()
                .map(|(k, v)| {
                    (
                        k.encode_utf16().collect(),
                        format!("{}:{}", ref_string(k), reference(v)),
                    )
                })
                .collect();
            members.sort_by(|a, b| a.0.cmp(&b.0));
            let members: Vec<String> = members.into_iter().map(|m| m.1).collect();
            format!("{{{}}}", members.join(","))
        }
    }
}

/// `write_canonical(x)` must equal JCS(serde_json::to_value(x)).
fn assert_matches_reference(x: &dyn Case) {
    let value = x.to_value();
    assert_eq!(
        x.canonical().as_deref(),
        Ok(&*reference(&value)),
        "for {value}"
    );
    assert_eq!(canon(&value), reference(&value), "for Value {value}");
}

#[test]
fn reference_formats_numbers_like_ecmascript() {
    for (f, s) in [
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (123.0, "123"),
        (0.1, "0.1"),
    ] {
        assert_eq!(ref_number(f), s);
    }
}

// -----------------------------------------------------------------------------------
// RFC 8785
// -----------------------------------------------------------------------------------

#[test]
// The RFC's decimal inputs are kept verbatim, though longer than an f64 holds.
#[allow(clippy::excessive_precision)]
fn rfc8785_appendix_b_numbers() {
    let vectors: &[(u64, &str)] = &[
        (0x0000_0000_0000_0000, "0"),
        (0x8000_0000_0000_0000, "0"),
        (0x0000_0000_0000_0001, "5e-324"),
        (0x8000_0000_0000_0001, "-5e-324"),
        (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
        (0xffef_ffff_ffff_ffff, "-1.7976931348623157e+308"),
        (0x4340_0000_0000_0000, "9007199254740992"),
        (0xc340_0000_0000_0000, "-9007199254740992"),
        (0x4430_0000_0000_0000, "295147905179352830000"),
        (0x44b5_2d02_c7e1_4af5, "9.999999999999997e+22"),
        (0x44b5_2d02_c7e1_4af6, "1e+23"),
        (0x44b5_2d02_c7e1_4af7, "1.0000000000000001e+23"),
        (0x444b_1ae4_d6e2_ef4e, "999999999999999700000"),
        (0x444b_1ae4_d6e2_ef4f, "999999999999999900000"),
        (0x444b_1ae4_d6e2_ef50, "1e+21"),
        (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
        (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
        (0x41b3_de43_5555_5553, "333333333.3333332"),
        (0x41b3_de43_5555_5554, "333333333.33333325"),
        (0x41b3_de43_5555_5555, "333333333.3333333"),
        (0x41b3_de43_5555_5556, "333333333.3333334"),
        (0x41b3_de43_5555_5557, "333333333.33333343"),
        (0xbecb_f647_612f_3696, "-0.0000033333333333333333"),
        (0x4314_3ff3_c1cb_0959, "1424953923781206.2"),
    ];
    for &(bits, want) in vectors {
        let f = f64::from_bits(bits);
        assert_eq!(canon(&f), want, "{bits:016x}");
        assert_eq!(ref_number(f), want, "reference, {bits:016x}");
    }
    for (f, want) in [
        (1.0, "1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (333_333_333.333_333_29, "333333333.3333333"),
        (19.99, "19.99"),
    ] {
        assert_eq!(canon(&f), want);
    }
    assert_eq!(
        canon(&0.1_f32),
        "0.10000000149011612",
        "f32 widens exactly, as to_value"
    );
}

#[test]
fn nan_and_infinity_are_errors() {
    for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut out = b"prefix".to_vec();
        assert_eq!(
            write_canonical(&vec![1.0, f], &mut out),
            Err(CanonicalError::NonFinite)
        );
        assert_eq!(out, b"prefix", "output restored on error");
    }
    assert_eq!(
        write_canonical(&f32::NAN, &mut Vec::new()),
        Err(CanonicalError::NonFinite)
    );
}

#[test]
// The RFC's decimal inputs are kept verbatim, though longer than an f64 holds.
#[allow(clippy::excessive_precision)]
fn rfc8785_section_3_2_4_example() {
    // The numbers are Rust literals: serde_json's default parser is off by one ULP on
    // 333333333.33333329 unless its `float_roundtrip` feature is on.
    let string: Value = serde_json::from_str(r#""\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/""#)
        .expect("valid JSON");
    let input = json!({
        "numbers": [333_333_333.333_333_29, 1E30, 4.50, 2e-3, 0.000_000_000_000_000_000_000_000_001],
        "string": string,
        "literals": [null, true, false]
    });
    assert_eq!(
        canon(&input),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
    );
}

#[test]
fn rfc8785_section_3_2_3_sorting_example() {
    let input: Value = serde_json::from_str(
        r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#,
    )
    .expect("valid JSON");
    assert_eq!(
        canon(&input),
        "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
         \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
         \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
    );
}

#[test]
fn string_escapes_are_minimal() {
    let all_controls: String = (0_u8..0x20).map(char::from).collect();
    assert_eq!(
        canon(&all_controls),
        "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\
         \\u000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\
         \\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\""
    );
    // DEL, '/', U+2028, non-ASCII and astral characters are written raw.
    assert_eq!(
        canon("q\"b\\s/\u{7f}\u{2028}é€😀"),
        "\"q\\\"b\\\\s/\u{7f}\u{2028}é€😀\""
    );
    assert_eq!(canon(&'\n'), "\"\\n\"");
    assert_eq!(canon(&'😀'), "\"😀\"");
}

#[test]
fn collect_str_is_escaped() {
    struct Shout;
    impl core::fmt::Display for Shout {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            writeln!(f, "say \"hi\"")
        }
    }
    impl Serialize for Shout {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(self)
        }
    }
    assert_eq!(canon(&Shout), r#""say \"hi\"\n""#);
    assert_matches_reference(&std::net::Ipv4Addr::new(10, 0, 0, 1));
}

// -----------------------------------------------------------------------------------
// Ordering
// -----------------------------------------------------------------------------------

#[test]
fn utf16_order_differs_from_utf8_order() {
    // U+10000 is the surrogate pair D800 DC00, which sorts before U+FFFF in UTF-16,
    // although its UTF-8 (and scalar value) sorts after.
    assert_eq!(jcs_cmp("\u{10000}", "\u{ffff}"), Ordering::Less);
    assert_eq!("\u{10000}".cmp("\u{ffff}"), Ordering::Greater);
    assert_eq!(jcs_cmp("a\u{1f600}", "a\u{e000}"), Ordering::Less);
    assert_eq!(jcs_cmp("\u{e000}", "\u{d7ff}"), Ordering::Greater);
    assert_eq!(
        canon(&json!({"\u{ffff}": 1, "\u{10000}": 2})),
        "{\"\u{10000}\":2,\"\u{ffff}\":1}"
    );
}

#[test]
fn jcs_cmp_agrees_with_utf16_comparison() {
    let pool = [
        "",
        "a",
        "b",
        "ab",
        "é",
        "ö",
        "€",
        "\u{e000}",
        "\u{ffff}",
        "\u{10000}",
        "😀",
        "中",
        "\u{7f}",
        "\u{80}",
    ];
    for a in pool {
        for b in pool {
            for c in pool {
                let x = format!("{a}{b}");
                let y = format!("{a}{c}");
                assert_eq!(
                    jcs_cmp(&x, &y),
                    x.encode_utf16().cmp(y.encode_utf16()),
                    "{x:?} vs {y:?}"
                );
            }
        }
    }
}

#[test]
fn struct_fields_are_sorted_and_duplicate_map_keys_keep_the_last() {
    #[derive(Serialize)]
    struct Unordered {
        zeta: u8,
        alpha: &'static str,
        #[serde(rename = "\u{ffff}")]
        bmp: bool,
        #[serde(rename = "\u{10000}")]
        astral: bool,
    }
    let x = Unordered {
        zeta: 1,
        alpha: "a",
        bmp: true,
        astral: false,
    };
    assert_eq!(
        canon(&x),
        "{\"alpha\":\"a\",\"zeta\":1,\"\u{10000}\":false,\"\u{ffff}\":true}"
    );

    struct Dupes;
    impl Serialize for Dupes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("b", &1)?;
            m.serialize_entry("a", &2)?;
            m.serialize_entry("b", &3)?;
            m.serialize_entry("a", &4)?;
            m.serialize_entry("c", &5)?;
            m.end()
        }
    }
    assert_matches_reference(&Dupes);
    assert_eq!(canon(&Dupes), r#"{"a":4,"b":3,"c":5}"#);
}

// -----------------------------------------------------------------------------------
// The integer rule
// -----------------------------------------------------------------------------------

#[test]
fn integers_beyond_2_pow_53_are_strings() {
    let cases: [(&dyn Case, &str); 13] = [
        (&9_007_199_254_740_991_u64, "9007199254740991"),
        (&9_007_199_254_740_992_u64, "\"9007199254740992\""),
        (&-9_007_199_254_740_991_i64, "-9007199254740991"),
        (&-9_007_199_254_740_992_i64, "\"-9007199254740992\""),
        (&u64::MAX, "\"18446744073709551615\""),
        (&i64::MIN, "\"-9223372036854775808\""),
        (&u128::MAX, "\"340282366920938463463374607431768211455\""),
        (&i128::MIN, "\"-170141183460469231731687303715884105728\""),
        (&5_i128, "5"),
        (&0_i64, "0"),
        (&json!(u64::MAX), "\"18446744073709551615\""),
        // Floats are always numbers, written per ECMAScript.
        (&9_007_199_254_740_992.0_f64, "9007199254740992"),
        (&1.8446744073709552e19_f64, "18446744073709552000"),
    ];
    for (value, want) in cases {
        assert_eq!(value.canonical().as_deref(), Ok(want));
    }
}

// -----------------------------------------------------------------------------------
// The serde data model, against the reference
// -----------------------------------------------------------------------------------

#[derive(Serialize, Debug, Clone)]
struct Inner {
    b: f64,
    a: i64,
}

#[derive(Serialize, Debug, Clone)]
enum Kind {
    Unit,
    Newtype(u64),
    Tuple(i8, String),
    Struct { y: char, x: () },
}

#[derive(Serialize, Debug)]
struct TupleStruct(u32, &'static str);

#[derive(Serialize, Debug)]
struct UnitStruct;

#[derive(Serialize, Debug)]
struct Wrapper(Inner);

#[derive(Serialize, Debug)]
struct Flat {
    k: u8,
    #[serde(flatten)]
    rest: BTreeMap<String, i32>,
}

#[derive(Serialize, Debug)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Tagged {
    Charge { zz: u8, amount: f64 },
    Refund(Inner),
}

#[derive(Serialize, Debug)]
#[serde(untagged)]
enum Untagged {
    Num(u8),
    Text(String),
}

#[derive(Serialize, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum KeyKind {
    Alpha,
    Beta,
}

#[derive(Serialize, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct KeyId(u32);

#[derive(Debug)]
struct Bytes(&'static [u8]);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

#[derive(Serialize, Debug)]
struct Everything {
    unit: (),
    none: Option<u8>,
    some: Option<&'static str>,
    unit_struct: UnitStruct,
    tuple: (u8, bool, char),
    tuple_struct: TupleStruct,
    wrapper: Wrapper,
    kinds: Vec<Kind>,
    flat: Flat,
    tagged: Vec<Tagged>,
    untagged: Vec<Untagged>,
    bytes: Bytes,
    int_keys: BTreeMap<i64, &'static str>,
    u128_keys: BTreeMap<u128, u8>,
    bool_keys: BTreeMap<bool, u8>,
    char_keys: BTreeMap<char, u8>,
    enum_keys: BTreeMap<KeyKind, u8>,
    newtype_keys: BTreeMap<KeyId, u8>,
    float_keys: Vec<(f64, u8)>,
    big: u64,
    neg_zero: f64,
}

struct FloatKeys<'a>(&'a [(f64, u8)]);

impl Serialize for FloatKeys<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

#[test]
fn serde_data_model_matches_to_value() {
    let x = Everything {
        unit: (),
        none: None,
        some: Some("s"),
        unit_struct: UnitStruct,
        tuple: (1, true, 'x'),
        tuple_struct: TupleStruct(7, "seven"),
        wrapper: Wrapper(Inner { b: 0.5, a: -3 }),
        kinds: vec![
            Kind::Unit,
            Kind::Newtype(u64::MAX),
            Kind::Tuple(-1, "t".into()),
            Kind::Struct { y: 'y', x: () },
        ],
        flat: Flat {
            k: 1,
            rest: [("b".to_owned(), 2), ("a".to_owned(), 1)].into(),
        },
        tagged: vec![
            Tagged::Charge {
                zz: 1,
                amount: 19.99,
            },
            Tagged::Refund(Inner { b: 1e21, a: 0 }),
        ],
        untagged: vec![Untagged::Num(3), Untagged::Text("three".into())],
        bytes: Bytes(&[0, 1, 255]),
        int_keys: [(-10, "neg"), (2, "two"), (10, "ten")].into(),
        u128_keys: [(u128::from(u64::MAX), 1)].into(),
        bool_keys: [(true, 1), (false, 0)].into(),
        char_keys: [('b', 1), ('\u{10000}', 2), ('\u{ffff}', 3)].into(),
        enum_keys: [(KeyKind::Beta, 2), (KeyKind::Alpha, 1)].into(),
        newtype_keys: [(KeyId(20), 2), (KeyId(3), 1)].into(),
        float_keys: vec![(1.0, 1), (0.5, 2), (1e21, 3)],
        big: 1 << 60,
        neg_zero: -0.0,
    };
    let cases: [&dyn Case; 10] = [
        &x,
        // Float map keys, as `serde_json` writes them (the value and its `to_value`).
        &FloatKeys(&x.float_keys),
        &Kind::Unit,
        &Kind::Newtype(3),
        &Kind::Tuple(1, "a".into()),
        &Kind::Struct { y: '"', x: () },
        &UnitStruct,
        &Option::<u8>::None,
        &Some(Some(1_u8)),
        &HashMap::from([("x", vec![1_u8]), ("é", vec![]), ("\u{10000}", vec![2])]),
    ];
    for value in cases {
        assert_matches_reference(value);
    }
}

#[test]
fn non_string_map_keys_are_errors() {
    let tuple_keys: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    assert!(serde_json::to_value(&tuple_keys).is_err());
    let option_keys: BTreeMap<Option<u8>, u8> = [(Some(1), 3)].into();
    let cases: [(&dyn Case, CanonicalError); 3] = [
        (&tuple_keys, CanonicalError::MapKeyNotString),
        (&option_keys, CanonicalError::MapKeyNotString),
        (&FloatKeys(&[(f64::NAN, 1)]), CanonicalError::NonFinite),
    ];
    for (value, want) in cases {
        assert_eq!(value.canonical(), Err(want));
    }
}

#[test]
fn custom_errors_are_reported() {
    struct Fails;
    impl Serialize for Fails {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no can do"))
        }
    }
    let mut out = Vec::new();
    assert_eq!(
        write_canonical(&vec![Some(Fails)], &mut out),
        Err(CanonicalError::Custom("no can do".into()))
    );
    assert!(out.is_empty());
}

#[test]
fn key_fields_refuse_numbers_that_may_not_be_exact() {
    // Floats below 2^53 and typed integers of any size are exact.
    let u128_max = format!("\"{}\"", u128::MAX);
    let cases: [(&dyn Case, &str); 4] = [
        (&9_007_199_254_740_991.0_f64, "9007199254740991"),
        (&-19.99_f64, "-19.99"),
        (&u64::MAX, "\"18446744073709551615\""),
        (&u128::MAX, &u128_max),
    ];
    for (value, want) in cases {
        assert_eq!(value.exact().as_deref(), Ok(want));
    }
    // 2^53 and above as floats, at any depth, are refused; NaN stays NonFinite.
    for f in [
        9_007_199_254_740_992.0_f64,
        -1e21,
        1.8446744073709552e19,
        f64::MAX,
    ] {
        assert!(
            matches!(exact(&f), Err(CanonicalError::InexactNumber(_))),
            "{f}"
        );
        assert!(matches!(
            exact(&serde_json::json!({"a": [1, {"b": f}]})),
            Err(CanonicalError::InexactNumber(_))
        ));
    }
    assert_eq!(exact(&f64::NAN), Err(CanonicalError::NonFinite));
    // The plain writer keeps writing them (arguments outside the key fields).
    assert_eq!(canon(&1e21_f64), "1e+21");
}

#[test]
fn serde_json_private_tokens_are_decoded() {
    // What `serde_json::Number` and `RawValue` serialize as when the
    // `arbitrary_precision` / `raw_value` features are on somewhere in the build.
    struct Token(&'static str, &'static str);
    impl Serialize for Token {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeStruct;
            let mut st = s.serialize_struct(self.0, 1)?;
            st.serialize_field(self.0, self.1)?;
            st.end()
        }
    }
    let number = |text| Token(SERDE_JSON_NUMBER_TOKEN, text);
    // In a key field, integer text outside the 64-bit range is refused as without the
    // feature (where serde_json has already made it a double).
    for (text, want) in [
        ("18446744073709551615", "\"18446744073709551615\""),
        ("-9223372036854775808", "\"-9223372036854775808\""),
    ] {
        assert_eq!(exact(&number(text)).as_deref(), Ok(want));
    }
    for text in ["18446744073709551616", "1e21"] {
        assert!(
            matches!(exact(&number(text)), Err(CanonicalError::InexactNumber(_))),
            "{text}"
        );
    }
    for (text, want) in [
        ("12", "12"),
        ("-0", "0"),
        ("1.50", "1.5"),
        ("1E30", "1e+30"),
        ("18446744073709551615", "\"18446744073709551615\""),
        (
            "-123456789012345678901234567890123456789012",
            "\"-123456789012345678901234567890123456789012\"",
        ),
    ] {
        assert_eq!(canon(&number(text)), want);
    }
    assert_eq!(
        write_canonical(&Token(SERDE_JSON_NUMBER_TOKEN, "1e400"), &mut Vec::new()),
        Err(CanonicalError::NonFinite)
    );
    assert_eq!(
        canon(&Token(SERDE_JSON_RAW_TOKEN, r#"{"b": 1, "a": [1.0, "x"]}"#)),
        r#"{"a":[1,"x"],"b":1}"#
    );
}

/// xorshift64*: a tiny deterministic generator for property-style checks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn string(&mut self) -> String {
        const POOL: &[char] = &[
            'a',
            'b',
            'z',
            'A',
            '0',
            '_',
            '.',
            '"',
            '\\',
            '/',
            '\n',
            '\t',
            '\u{1}',
            '\u{1f}',
            '\u{7f}',
            '\u{80}',
            'é',
            'ö',
            '€',
            '中',
            '\u{e000}',
            '\u{fb33}',
            '\u{ffff}',
            '\u{10000}',
            '😀',
            '\u{10ffff}',
        ];
        let len = self.below(6);
        (0..len)
            .map(|_| POOL[self.below(POOL.len() as u64) as usize])
            .collect()
    }

    fn float(&mut self) -> f64 {
        match self.below(4) {
            0 => (self.below(2000) as f64 - 1000.0) / 8.0,
            1 => (self.below(100_000) as f64) / 100.0,
            _ => loop {
                let f = f64::from_bits(self.next());
                if f.is_finite() {
                    break f;
                }
            },
        }
    }

    fn value(&mut self, depth: u32) -> Value {
        let kinds = if depth == 0 { 6 } else { 8 };
        match self.below(kinds) {
            0 => Value::Null,
            1 => Value::Bool(self.below(2) == 1),
            2 => match self.below(3) {
                0 => json!(self.next()),
                1 => json!(self.next() as i64),
                _ => json!(self.below(1 << 54) as i64 - (1 << 53)),
            },
            3 => json!(self.float()),
            4 | 5 => Value::String(self.string()),
            6 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => Value::Object(
                (0..self.below(5))
                    .map(|_| (self.string(), self.value(depth - 1)))
                    .collect(),
            ),
        }
    }
}

#[test]
fn random_values_match_the_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let value = rng.value(4);
        assert_eq!(canon(&value), reference(&value), "for {value}");
    }
}

#[test]
fn random_typed_values_match_to_value() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for _ in 0..500 {
        let inners: Vec<Inner> = (0..rng.below(3))
            .map(|_| Inner {
                b: rng.float(),
                a: rng.next() as i64,
            })
            .collect();
        let map: HashMap<String, Option<Kind>> = (0..rng.below(5))
            .map(|_| {
                let kind = match rng.below(5) {
                    0 => None,
                    1 => Some(Kind::Unit),
                    2 => Some(Kind::Newtype(rng.next())),
                    3 => Some(Kind::Tuple(rng.next() as i8, rng.string())),
                    _ => Some(Kind::Struct {
                        y: rng.string().chars().next().unwrap_or('y'),
                        x: (),
                    }),
                };
                (rng.string(), kind)
            })
            .collect();
        let int_keys: HashMap<i64, String> = (0..rng.below(4))
            .map(|_| (rng.next() as i64, rng.string()))
            .collect();
        assert_matches_reference(&(inners, map, int_keys));
    }
}

// -----------------------------------------------------------------------------------
// Keys
// -----------------------------------------------------------------------------------

#[test]
fn empty_key_fields_are_refused() {
    let cases: [(&dyn Case, &str); 9] = [
        (&Value::Null, "null"),
        (&Option::<String>::None, "null"),
        (&(), "null"),
        (&"", "an empty string"),
        (&String::new(), "an empty string"),
        (&Vec::<u8>::new(), "an empty array"),
        (&json!([]), "an empty array"),
        (&BTreeMap::<String, u8>::new(), "an empty object"),
        (&json!({}), "an empty object"),
    ];
    for (value, found) in cases {
        let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
        let err = value.add(&mut builder, "cart.id").expect_err("refused");
        assert_eq!(
            err,
            KeyFieldError::Empty {
                field: "cart.id".into(),
                found
            }
        );
        assert!(err.to_string().contains("`cart.id`"), "{err}");
        // The builder is unchanged and still usable.
        builder.field("user_id", "u-1").expect("accepted");
        assert_eq!(
            builder.finish_document(None, "t", 1),
            br#"{"contract":"tool-contracts/key/v1","fields":{"user_id":"u-1"},"scope":null,"tool":"t","version":1}"#
        );
    }
}

#[test]
fn falsy_values_are_not_empty() {
    let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
    let cases: [(&str, &dyn Case); 6] = [
        ("a", &0),
        ("b", &false),
        ("c", &json!([null])),
        ("d", &json!({"x": null})),
        ("e", &0.0),
        ("f", &" "),
    ];
    for (path, value) in cases {
        if let Err(e) = value.add(&mut builder, path) {
            panic!("`{path}` is a value, not empty: {e}");
        }
    }
    assert_eq!(
        builder.finish_document(Some("s"), "t", 2),
        br#"{"contract":"tool-contracts/key/v1","fields":{"a":0,"b":false,"c":[null],"d":{"x":null},"e":0,"f":" "},"scope":"s","tool":"t","version":2}"#
    );
}

#[test]
fn unencodable_key_fields_name_the_field() {
    let mut builder = KeyBuilder::new(TOOL_KEY_CONTRACT);
    let err = builder
        .field("amount", &f64::NAN)
        .expect_err("NaN is refused");
    assert_eq!(
        err,
        KeyFieldError::Encode {
            field: "amount".into(),
            source: CanonicalError::NonFinite
        }
    );
    assert!(err.to_string().contains("`amount`"), "{err}");
}

/// Lowercase hex SHA-256 of `bytes`, through the module's hex encoder.
fn sha256_hex(bytes: &[u8]) -> String {
    let mut hex = String::new();
    push_hex(&mut hex, &Sha256::digest(bytes));
    hex
}

#[test]
fn finish_hashes_the_document() {
    let build = || {
        let mut b = KeyBuilder::new(TOOL_KEY_CONTRACT);
        b.field("x", &1).expect("ok");
        b
    };
    let doc = build().finish_document(None, "tool", 3);
    let key = build().finish(None, "tool", 3);
    assert_eq!(key, sha256_hex(&doc));
    assert_eq!(key.len(), 64);
    assert!(key
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    // sha256("abc"), FIPS 180-2 test vector: pins the hex encoding.
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn the_contract_is_a_parameter() {
    let mut b = KeyBuilder::new("tool-contracts/run/v1");
    b.field("x", &1).expect("ok");
    assert_eq!(
        b.finish_document(None, "t", 1),
        br#"{"contract":"tool-contracts/run/v1","fields":{"x":1},"scope":null,"tool":"t","version":1}"#
    );
}

#[test]
fn scope_tool_and_version_change_the_key() {
    let v = json!("v");
    let base = tool_key("t", 1, None, &[("x", &v)]).expect("ok");
    for (tool, version, scope) in [
        ("t", 2, None),
        ("u", 1, None),
        ("t", 1, Some("")),
        ("t", 1, Some("null")),
    ] {
        let key = tool_key(tool, version, scope, &[("x", &v)]).expect("ok");
        assert_ne!(base, key, "{tool} {version} {scope:?}");
    }
}

#[test]
fn tool_key_sorts_fields_and_refuses_duplicates() {
    let (a, b) = (json!(1), json!("two"));
    assert_eq!(
        tool_key("t", 1, None, &[("b.x", &b), ("a", &a)]),
        tool_key("t", 1, None, &[("a", &a), ("b.x", &b)])
    );
    assert_eq!(
        tool_key("t", 1, None, &[("a", &a), ("b", &b), ("a", &b)]),
        Err(KeyFieldError::DuplicateField { field: "a".into() })
    );
    assert_eq!(
        tool_key("t", 1, None, &[("a", &Value::Null)]),
        Err(KeyFieldError::Empty {
            field: "a".into(),
            found: "null"
        })
    );
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "strictly increasing JCS order")]
fn unsorted_fields_are_caught_in_debug_builds() {
    let mut b = KeyBuilder::new(TOOL_KEY_CONTRACT);
    let _ = b.field("b", &1);
    let _ = b.field("a", &1);
}

/// The generated form (`field_member`, `finish_tail`, the constant parts encoded by the
/// macro) writes the key the by-path builder writes, for scoped and unscoped keys, several
/// fields, odd tool names and versions.
#[test]
fn the_generated_form_writes_the_by_path_key() {
    /// Tool, version, scope, fields.
    type Case<'a> = (&'a str, u32, Option<&'a str>, &'a [(&'a str, Value)]);
    let cases: &[Case] = &[
        (
            "create_order",
            1,
            None,
            &[("cart.id", json!("c-42")), ("user_id", json!(7))],
        ),
        (
            "ship.v2-express",
            12,
            Some("tenant \"7\"\n"),
            &[("parcel.id", json!("p-1"))],
        ),
        (
            "A_b-9.z",
            u32::MAX,
            Some(""),
            &[("a", json!({"b": [1, 2.5, "é"]})), ("pair.0", json!(true))],
        ),
    ];
    for (tool, version, scope, fields) in cases {
        let mut by_path = KeyBuilder::new(TOOL_KEY_CONTRACT);
        let mut generated = KeyBuilder::new(TOOL_KEY_CONTRACT);
        for (path, value) in *fields {
            by_path.field(path, value).expect("field");
            // As the macro writes it: `"<path>":`, leaked to the `'static` the API takes.
            let member: &'static str = Box::leak(format!("\"{path}\":").into_boxed_str());
            generated
                .field_member(member, path, value)
                .expect("field_member");
        }
        let tail: &'static str = Box::leak(key_tail(tool, *version).into_boxed_str());
        assert_eq!(
            tail,
            format!(",\"tool\":\"{tool}\",\"version\":{version}}}"),
            "the tail the macro writes for {tool}"
        );
        assert_eq!(
            generated.finish_tail(*scope, tail, tool, *version),
            by_path.finish(*scope, tool, *version),
            "{tool} {version} {scope:?}"
        );
    }
}
