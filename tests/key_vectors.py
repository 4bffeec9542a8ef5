#!/usr/bin/env python3
"""Independent generator and checker for tests/key_vectors.json.

This is a second implementation of the key spec (docs/key-spec.md), written from the
spec alone with the Python standard library: a hand-written RFC 8785 (JCS) encoder and
hashlib's SHA-256. The Rust test runtime/tests/key_vectors.rs checks the Rust
implementation against the vectors this script writes, so the two implementations
cross-check each other.

    python3 tests/key_vectors.py           # rewrite tests/key_vectors.json
    python3 tests/key_vectors.py --check   # exit 1 if the file differs from what this computes

Before doing either, the script checks its own JCS against RFC 8785's examples.
"""

import hashlib
import json
import math
import struct
import sys
import unicodedata
from pathlib import Path

TOOL_KEY_CONTRACT = "tool-contracts/key/v1"
MAX_SAFE_INTEGER = 2**53 - 1
VECTORS_PATH = Path(__file__).with_name("key_vectors.json")


def jcs_number(x: float) -> str:
    """ECMAScript Number.prototype.toString(x), as RFC 8785 section 3.2.2.3 requires.

    Python's repr() gives the same shortest round-trip digits (ties to even), but not the
    same layout (repr(1e-7) == '1e-07', repr(1e16) == '1e+16', repr(100.0) == '100.0'),
    so the digits and exponent are taken from repr() and laid out per ECMA-262.
    """
    if math.isnan(x) or math.isinf(x):
        raise ValueError("NaN and Infinity have no canonical JSON form")
    if x == 0:
        return "0"  # also -0
    sign = "-" if x < 0 else ""
    mantissa, _, exponent = repr(abs(x)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + (int(exponent) if exponent else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point  # value = 0.DIGITS * 10**n
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * -n + digits
    else:
        e = n - 1
        exp = ("+" if e >= 0 else "-") + str(abs(e))
        body = (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + exp
    return sign + body


SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def jcs_string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in SHORT_ESCAPES:
            out.append(SHORT_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def utf16_units(s: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like sequences of UTF-16 code units.
    return s.encode("utf-16-be")


def jcs(value) -> str:
    """RFC 8785 canonical JSON, plus the key spec's integer rule."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        # Integers beyond 2**53 - 1 in magnitude are written as strings of their digits.
        return jcs_string(str(value)) if abs(value) > MAX_SAFE_INTEGER else str(value)
    if isinstance(value, float):
        return jcs_number(value)
    if isinstance(value, str):
        return jcs_string(value)
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=utf16_units)
        return "{" + ",".join(jcs_string(k) + ":" + jcs(value[k]) for k in keys) + "}"
    raise TypeError(f"not a JSON value: {value!r}")


class KeyFieldRefused(ValueError):
    """A key field the spec refuses; `path` names it."""

    def __init__(self, path: str, why: str):
        super().__init__(f"key field {path!r} {why}")
        self.path = path


def exact(value) -> bool:
    """The key fields' number rule (spec 3.3): every number, at any depth, is a float of
    magnitude below 2^53 or an integer in the 64-bit range (-2^63 .. 2^64 - 1). Anything else
    may already be the rounding of another number when a server parses the JSON."""
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return -(2**63) <= value <= 2**64 - 1
    if isinstance(value, float):
        return not math.isfinite(value) or abs(value) < 2.0**53
    if isinstance(value, list):
        return all(exact(v) for v in value)
    return all(exact(v) for v in value.values())


def key_document(tool: str, version: int, scope, fields: dict) -> str:
    for path, value in fields.items():
        if not exact(value):
            raise KeyFieldRefused(path, "holds a number that may not be exact (send it as a string)")
        if jcs(value) in ("null", '""', "[]", "{}"):
            raise KeyFieldRefused(path, "is empty")
    return jcs(
        {
            "contract": TOOL_KEY_CONTRACT,
            "fields": fields,
            "scope": scope,
            "tool": tool,
            "version": version,
        }
    )


def tool_key(tool: str, version: int, scope, fields: dict) -> str:
    return hashlib.sha256(key_document(tool, version, scope, fields).encode("utf-8")).hexdigest()


def self_test() -> None:
    """Checks this JCS against RFC 8785's own examples."""
    appendix_b = [
        ("0000000000000000", "0"),
        ("8000000000000000", "0"),
        ("0000000000000001", "5e-324"),
        ("8000000000000001", "-5e-324"),
        ("7fefffffffffffff", "1.7976931348623157e+308"),
        ("ffefffffffffffff", "-1.7976931348623157e+308"),
        ("4340000000000000", "9007199254740992"),
        ("c340000000000000", "-9007199254740992"),
        ("4430000000000000", "295147905179352830000"),
        ("44b52d02c7e14af5", "9.999999999999997e+22"),
        ("44b52d02c7e14af6", "1e+23"),
        ("44b52d02c7e14af7", "1.0000000000000001e+23"),
        ("444b1ae4d6e2ef4e", "999999999999999700000"),
        ("444b1ae4d6e2ef4f", "999999999999999900000"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("41b3de4355555553", "333333333.3333332"),
        ("41b3de4355555554", "333333333.33333325"),
        ("41b3de4355555555", "333333333.3333333"),
        ("41b3de4355555556", "333333333.3333334"),
        ("41b3de4355555557", "333333333.33333343"),
        ("becbf647612f3696", "-0.0000033333333333333333"),
        ("43143ff3c1cb0959", "1424953923781206.2"),
    ]
    for bits, want in appendix_b:
        (x,) = struct.unpack(">d", bytes.fromhex(bits))
        got = jcs_number(x)
        assert got == want, f"{bits}: {got} != {want}"
    for x, want in [(1e-7, "1e-7"), (1e16, "10000000000000000"), (100.0, "100"), (19.99, "19.99")]:
        assert jcs_number(x) == want, (x, jcs_number(x), want)

    # RFC 8785 section 3.2.4 (the whole transformation).
    example = json.loads(
        '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        ' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        ' "literals": [null, true, false]}'
    )
    want = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert jcs(example) == want, jcs(example)

    # RFC 8785 section 3.2.3 (sorting by UTF-16 code units).
    sorting = {"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\U0001F600": 5, "\u0080": 6, "\u00f6": 7}
    assert [sorting[k] for k in sorted(sorting, key=utf16_units)] == [2, 4, 6, 7, 1, 5, 3]
    assert sorted(["\uffff", "\U00010000"], key=utf16_units) == ["\U00010000", "\uffff"]

    # SHA-256 of "abc" (FIPS 180-2).
    assert (
        hashlib.sha256(b"abc").hexdigest()
        == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


# The inputs. `fields` maps each key field path, as written in the tool's attribute, to the
# JSON value of that field. Floats are written here as Python floats; keep them to values
# whose JSON text (repr) any correctly rounding parser reads back exactly.
INPUTS = [
    {
        "description": "worked example of docs/key-spec.md: two fields, one a dotted path, null scope",
        "tool": "checkout",
        "version": 1,
        "scope": None,
        "fields": {"user_id": "u-1001", "cart.id": "c-42"},
    },
    {
        "description": "non-ASCII strings are written raw (UTF-8): Latin, CJK, emoji",
        "tool": "send_message",
        "version": 1,
        "scope": None,
        "fields": {"city": "Zürich", "greeting": "こんにちは世界", "reaction": "🙂👍🏽"},
    },
    {
        "description": "nested object whose keys need sorting, inside an array",
        "tool": "place_order",
        "version": 1,
        "scope": "tenant-a",
        "fields": {
            "cart": {
                "items": [{"sku": "B-2", "qty": 1}, {"sku": "A-1", "qty": 3, "gift": True}],
                "id": "c-42",
                "currency": "EUR",
            }
        },
    },
    {
        "description": "floats are written per ECMAScript: 19.99, 0.5, 1e-7, 100.0 -> 100, -0.0 -> 0, and the largest float below 2^53",
        "tool": "charge",
        "version": 1,
        "scope": None,
        "fields": {
            "amount": 19.99,
            "rate": 0.5,
            "tiny": 1e-7,
            "largest": 9007199254740991.0,
            "whole": 100.0,
            "neg_zero": -0.0,
            "lat": 47.3769,
        },
    },
    {
        "description": "integers beyond 2^53 - 1 are written as strings; 2^53 - 1 itself stays a number",
        "tool": "transfer",
        "version": 1,
        "scope": None,
        "fields": {
            "account": 18446744073709551615,
            "ledger": -9223372036854775808,
            "max_safe": 9007199254740991,
            "first_unsafe": 9007199254740992,
            "min_safe": -9007199254740991,
        },
    },
    {
        "description": "scope with non-ASCII characters",
        "tool": "create_invoice",
        "version": 1,
        "scope": "tenant:Müller-GmbH/東京",
        "fields": {"invoice.number": "INV-2024-0001"},
    },
    {
        "description": "version greater than 1",
        "tool": "create_invoice",
        "version": 7,
        "scope": None,
        "fields": {"invoice.number": "INV-2024-0001"},
    },
    {
        "description": "escaped control characters, quotes and backslashes; DEL and '/' stay raw",
        "tool": "write_note",
        "version": 1,
        "scope": None,
        "fields": {"note": 'line1\nline2\ttab "quoted" back\\slash \u0001 \u001f \u007f / \b\f\r'},
    },
    {
        "description": "object keys sort by UTF-16 code units: U+10000 before U+FFFF, emoji before U+FB33",
        "tool": "tag",
        "version": 1,
        "scope": None,
        "fields": {
            "labels": {
                "\uffff": "bmp-last",
                "\U00010000": "astral-first",
                "\ufb33": "hebrew",
                "€": "euro",
                "😀": "emoji",
                "ö": "o-umlaut",
                "\r": "cr",
                "1": "one",
                "\u0080": "control",
            }
        },
    },
    {
        "description": "falsy values are not empty: false, 0 and [null] are real values",
        "tool": "set_flags",
        "version": 2,
        "scope": None,
        "fields": {"dry_run": False, "count": 0, "slots": [None], "tags": ["b", "a"]},
    },
    {
        "description": "several dotted paths sort as plain strings (JCS order of the paths)",
        "tool": "ship",
        "version": 3,
        "scope": "org/42",
        "fields": {
            "order.id": "o-1",
            "order.customer.email": "ada@example.com",
            "order_id": "legacy-1",
            "address": {"zip": "8001", "street": "Bahnhofstrasse 1", "country": "CH"},
        },
    },
    {
        "description": "object keys that need escaping",
        "tool": "store",
        "version": 1,
        "scope": None,
        "fields": {"meta": {'a"b': 1, "a\\b": 2, "a\nb": 3, "a b": 4}},
    },
    {
        "description": "deep nesting, mixed arrays and a negative float",
        "tool": "analyze",
        "version": 1,
        "scope": "",
        "fields": {
            "query": {
                "filters": [
                    {"op": "and", "args": [{"field": "delta", "lt": -0.0000033333333333333333}]},
                    [1, [2, [3, []]], {}],
                ],
                "limit": 50,
            }
        },
    },
    {
        "description": "an empty-string scope differs from a null scope (compare with the first vector)",
        "tool": "checkout",
        "version": 1,
        "scope": "",
        "fields": {"user_id": "u-1001", "cart.id": "c-42"},
    },
    # Refused: no key. A server that parses JSON into doubles cannot tell these numbers
    # from their neighbours, so two intents could share a key (spec 3.3).
    {
        "description": "refused: a float of magnitude 2^53 or more (1e+21) in a key field",
        "tool": "charge",
        "version": 1,
        "scope": None,
        "fields": {"amount": 19.99, "huge": 1e21},
        "error": "huge",
    },
    {
        "description": "refused: an integer beyond the 64-bit range (2^64) in a key field: send it as a string",
        "tool": "book_by_ref",
        "version": 1,
        "scope": None,
        "fields": {"order_ref": 18446744073709551616},
        "error": "order_ref",
    },
    {
        "description": "refused: 2^53 as a float, nested in a key field's object",
        "tool": "place_order",
        "version": 1,
        "scope": None,
        "fields": {"cart": {"ids": [1, 9007199254740992.0]}},
        "error": "cart",
    },
]


def build_vectors() -> list:
    vectors = []
    for spec in INPUTS:
        if "error" in spec:
            try:
                key_document(spec["tool"], spec["version"], spec["scope"], spec["fields"])
            except KeyFieldRefused as refused:
                assert refused.path == spec["error"], (refused.path, spec)
                vectors.append(dict(spec))
                continue
            raise AssertionError(f"not refused: {spec['description']}")
        canonical = key_document(spec["tool"], spec["version"], spec["scope"], spec["fields"])
        vectors.append(
            {
                "description": spec["description"],
                "tool": spec["tool"],
                "version": spec["version"],
                "scope": spec["scope"],
                "fields": spec["fields"],
                "canonical": canonical,
                "key": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
            }
        )
    return vectors


def render(vectors: list) -> str:
    """Pretty JSON with readable UTF-8, but invisible characters (controls, unassigned and
    private-use code points) escaped as \\uXXXX so the file shows what it holds. Outside
    strings the text is ASCII, so escaping them everywhere only touches string contents."""
    text = json.dumps(vectors, ensure_ascii=False, indent=2) + "\n"
    out = []
    for ch in text:
        if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Cn", "Co", "Cs"):
            out.append(json.dumps(ch)[1:-1])  # \uXXXX, or a surrogate pair
        else:
            out.append(ch)
    return "".join(out)


def main() -> int:
    self_test()
    text = render(build_vectors())
    # The file must parse back to exactly the inputs (floats included).
    assert json.loads(text) == build_vectors()
    if "--check" in sys.argv[1:]:
        current = VECTORS_PATH.read_text(encoding="utf-8")
        if current != text:
            print(f"{VECTORS_PATH} differs from what {Path(__file__).name} computes", file=sys.stderr)
            return 1
        print(f"{VECTORS_PATH}: {len(json.loads(text))} vectors OK")
        return 0
    VECTORS_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {len(json.loads(text))} vectors to {VECTORS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
