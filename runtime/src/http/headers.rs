//! What the router reads from request headers: the client's `Idempotency-Key`, `Prefer`,
//! which representation `Accept` asks for, what `Content-Type` the body has, and whether a
//! browser sent a state-changing request from another origin.

use axum::http::{header, HeaderMap, HeaderName, Method};

use crate::error::Error;

/// The client's intent key header (IETF httpapi `Idempotency-Key` draft; Stripe's).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// What the caller may name as the field of an invalid client key.
pub(super) const IDEMPOTENCY_KEY_FIELD: &str = "Idempotency-Key";

/// The client's `Idempotency-Key`, if it sent one, checked by the rule every surface keeps
/// ([`validate_client_key`](crate::ambient::validate_client_key)).
///
/// The draft defines the header as a Structured Field String (`"8e03978e-…"`, RFC 8941
/// 3.3.3); Stripe and most clients send the bare value (`8e03978e-…`). Both are accepted: a
/// value in double quotes is read as an sf-string (its escapes `\"` and `\\` undone), any
/// other as it is. Sent twice, not visible ASCII, or an sf-string that does not parse, it
/// is refused, naming the header.
pub(super) fn client_key(headers: &HeaderMap, tool: &str) -> Result<Option<String>, Error> {
    let invalid = |message: String| Error::InvalidArguments {
        tool: tool.to_owned(),
        field: Some(IDEMPOTENCY_KEY_FIELD.to_owned()),
        message,
    };
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(
            "the request carries `Idempotency-Key` more than once; nothing ran. Send one key, the same with every retry of one intent".to_owned(),
        ));
    }
    let text = value.to_str().map_err(|_| {
        invalid("`Idempotency-Key` is not visible ASCII; nothing ran. Send printable ASCII (a UUID fits), the same with every retry of one intent".to_owned())
    })?;
    let key = match text.strip_prefix('"') {
        Some(quoted) => sf_string(quoted).ok_or_else(|| {
            invalid(format!(
                "`Idempotency-Key: {text}` starts with a double quote but is not a Structured Field String (RFC 8941: one closing quote, only `\\\"` and `\\\\` escaped); nothing ran. Send the key bare or as \"<key>\""
            ))
        })?,
        None => text.to_owned(),
    };
    crate::ambient::validate_client_key(tool, IDEMPOTENCY_KEY_FIELD, &key)?;
    Ok(Some(key))
}

/// The rest of an RFC 8941 sf-string after its opening quote: its value, or `None` if it
/// does not parse. Hand-written: these eight lines are the whole grammar (printable ASCII,
/// two escapes, one closing quote), and no crate offers sf-strings without a full
/// structured-field parser, which would refuse the bare keys most clients send.
fn sf_string(rest: &str) -> Option<String> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return None,
            },
            '"' => return chars.next().is_none().then_some(out),
            ' '..='~' => out.push(c),
            _ => return None,
        }
    }
    None
}

/// `Prefer` (RFC 7240), made once rather than validated on every request.
static PREFER: header::HeaderName = header::HeaderName::from_static("prefer");

/// Whether `Prefer` asks for `return=representation` (RFC 7240, 4.2): the result in the
/// answer instead of the redirect. Preferences are comma-separated, each `token[=value]`
/// with optional `;` parameters; names are case-insensitive.
pub(super) fn prefers_representation(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(&PREFER).iter();
    // What nearly every client that asks sends, recognised without splitting.
    if let (Some(only), None) = (values.next(), values.next()) {
        if only
            .as_bytes()
            .eq_ignore_ascii_case(b"return=representation")
        {
            return true;
        }
    }
    headers
        .get_all(&PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|pref| pref.split(';').next())
        .any(|pref| match pref.split_once('=') {
            Some((name, value)) => {
                name.trim().eq_ignore_ascii_case("return")
                    && value
                        .trim()
                        .trim_matches('"')
                        .eq_ignore_ascii_case("representation")
            }
            None => false,
        })
}

/// Whether the client prefers HTML to JSON: `Accept` names `text/html` (or
/// `application/xhtml+xml`) with a quality above that of JSON (`application/json`,
/// `application/*` or `*/*`, whichever is most specific). A browser's `text/html,…,*/*;q=0.8`
/// gets HTML; curl's `*/*`, no `Accept`, or a tie get JSON.
pub(super) fn prefers_html(headers: &HeaderMap) -> bool {
    let mut html: Option<f32> = None;
    // (specificity, quality) of the most specific range matching JSON.
    let mut json: Option<(u8, f32)> = None;
    for range in headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
    {
        let Ok(media) = range.trim().parse::<mime::Mime>() else {
            continue;
        };
        let quality = media
            .get_param("q")
            .and_then(|q| q.as_str().parse::<f32>().ok())
            .filter(|q| (0.0..=1.0).contains(q))
            .unwrap_or(1.0);
        let (kind, sub) = (media.type_(), media.subtype());
        if (kind == mime::TEXT && sub == mime::HTML)
            || (kind == mime::APPLICATION && sub == "xhtml" && media.suffix() == Some(mime::XML))
        {
            html = Some(html.map_or(quality, |q: f32| q.max(quality)));
        }
        let specificity = match (kind, sub) {
            (mime::APPLICATION, mime::JSON) => 3,
            (mime::APPLICATION, mime::STAR) => 2,
            (mime::STAR, mime::STAR) => 1,
            _ => 0,
        };
        if specificity > 0 && json.is_none_or(|(s, _)| specificity > s) {
            json = Some((specificity, quality));
        }
    }
    match html {
        Some(html) if html > 0.0 => html > json.map_or(0.0, |(_, q)| q),
        _ => false,
    }
}

/// What a tool call's body is, by its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyKind {
    /// `application/json` or any `+json` type.
    Json,
    /// `application/x-www-form-urlencoded`: an HTML form.
    Form,
}

/// The kind of a non-empty body, or `Err` with what the request named (for the `415`).
pub(super) fn body_kind(headers: &HeaderMap) -> Result<BodyKind, String> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err("no Content-Type".to_owned());
    };
    let text = value
        .to_str()
        .map_err(|_| "an unreadable Content-Type".to_owned())?;
    // What nearly every call sends, recognised without parsing a media type.
    if text.eq_ignore_ascii_case("application/json") {
        return Ok(BodyKind::Json);
    }
    let media = text
        .parse::<mime::Mime>()
        .map_err(|_| format!("Content-Type `{text}`"))?;
    match (media.type_(), media.subtype(), media.suffix()) {
        (mime::APPLICATION, mime::JSON, _) | (mime::APPLICATION, _, Some(mime::JSON)) => {
            Ok(BodyKind::Json)
        }
        (mime::APPLICATION, mime::WWW_FORM_URLENCODED, _) => Ok(BodyKind::Form),
        _ => Err(format!("Content-Type `{text}`")),
    }
}

/// The media types a tool call's body may have, for `Accept-Post` and the `415`'s detail.
pub(super) const ACCEPTED_BODIES: &str = "application/json, application/x-www-form-urlencoded";

/// Whether a state-changing request comes from a browser page of another origin (a
/// cross-site form post, CSRF): the rule of Go's `net/http.CrossOriginProtection`.
///
/// - `Sec-Fetch-Site` (sent by every current browser): `same-origin` or `none` (typed in,
///   a bookmark) pass, anything else (`cross-site`, `same-site`) is cross-origin;
/// - else `Origin`: its host must be the request's `Host`;
/// - neither header: not a browser (curl, an SDK, a server), which passes.
///
/// `trusted` origins (`https://app.example.com`) pass whatever the headers say. Safe
/// methods (`GET`, `HEAD`, `OPTIONS`) always pass.
pub(super) fn is_cross_origin(method: &Method, headers: &HeaderMap, trusted: &[String]) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if origin.is_some_and(|o| trusted.iter().any(|t| t.eq_ignore_ascii_case(o))) {
        return false;
    }
    // A `static` name: `get` with a `&str` parses and lower-cases it on every call.
    static SEC_FETCH_SITE: header::HeaderName = header::HeaderName::from_static("sec-fetch-site");
    if let Some(site) = headers.get(&SEC_FETCH_SITE) {
        return !matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = origin else {
        return false;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    // `scheme://host[:port]`: compare what follows the scheme with `Host`.
    let origin_host = origin.split_once("://").map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(origin_host), Some(host)) => !origin_host.eq_ignore_ascii_case(host),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn idempotency_keys_are_read_bare_or_as_sf_strings_and_checked() {
        let key = |value: &str| client_key(&headers(&[("idempotency-key", value)]), "t");
        assert_eq!(key("abc-1").unwrap().as_deref(), Some("abc-1"));
        assert_eq!(key("\"abc-1\"").unwrap().as_deref(), Some("abc-1"));
        assert_eq!(key(r#""a\"b\\c""#).unwrap().as_deref(), Some(r#"a"b\c"#));
        assert_eq!(client_key(&HeaderMap::new(), "t").unwrap(), None);
        for bad in ["\"abc", "\"a\"b\"", r#""a\nb""#, "\"\"", &"k".repeat(256)] {
            let e = key(bad).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidArguments { field: Some(f), .. } if f == "Idempotency-Key"),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains("nothing ran"), "{e}");
        }
        let twice = headers(&[("idempotency-key", "a"), ("idempotency-key", "a")]);
        assert!(client_key(&twice, "t")
            .unwrap_err()
            .to_string()
            .contains("more than once"));
    }

    #[test]
    fn prefer_return_representation_is_found_among_other_preferences() {
        let prefers = |v: &str| prefers_representation(&headers(&[("prefer", v)]));
        assert!(prefers("return=representation"));
        assert!(prefers("respond-async, RETURN = \"representation\"; x=1"));
        assert!(!prefers("return=minimal"));
        assert!(!prefers("wait=10"));
        assert!(!prefers_representation(&HeaderMap::new()));
        // The one-value fast path and the parse agree: any case, or in a second header.
        assert!(prefers("Return=Representation"));
        assert!(!prefers("return=representations"));
        assert!(prefers_representation(&headers(&[
            ("prefer", "wait=10"),
            ("prefer", "return=representation"),
        ])));
    }

    #[test]
    fn html_only_when_accept_ranks_it_above_json() {
        let html = |v: &str| prefers_html(&headers(&[("accept", v)]));
        assert!(html(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        ));
        assert!(html("text/html"));
        assert!(html("application/json;q=0.5, text/html"));
        assert!(!html("*/*"));
        assert!(!html("application/json"));
        assert!(!html("application/json, text/html"));
        assert!(!html("text/html;q=0, */*"));
        assert!(!html("text/html;q=0.5, application/*"));
        assert!(!prefers_html(&HeaderMap::new()));
    }

    #[test]
    fn bodies_are_json_or_forms() {
        let kind = |v: &str| body_kind(&headers(&[("content-type", v)]));
        assert_eq!(kind("application/json"), Ok(BodyKind::Json));
        assert_eq!(kind("application/json; charset=utf-8"), Ok(BodyKind::Json));
        assert_eq!(kind("application/merge-patch+json"), Ok(BodyKind::Json));
        assert_eq!(
            kind("application/x-www-form-urlencoded"),
            Ok(BodyKind::Form)
        );
        assert!(kind("multipart/form-data; boundary=x").is_err());
        assert!(kind("text/plain").is_err());
        assert!(body_kind(&HeaderMap::new()).is_err());
    }

    #[test]
    fn cross_origin_posts_from_browsers_are_recognised() {
        let post = Method::POST;
        let cross = |pairs: &[(&str, &str)]| is_cross_origin(&post, &headers(pairs), &[]);
        assert!(!cross(&[]), "curl: no browser headers");
        assert!(!cross(&[("sec-fetch-site", "same-origin")]));
        assert!(!cross(&[("sec-fetch-site", "none")]));
        assert!(cross(&[("sec-fetch-site", "cross-site")]));
        assert!(cross(&[("sec-fetch-site", "same-site")]));
        assert!(!cross(&[
            ("origin", "http://127.0.0.1:8090"),
            ("host", "127.0.0.1:8090")
        ]));
        assert!(cross(&[
            ("origin", "https://evil.example"),
            ("host", "127.0.0.1:8090")
        ]));
        assert!(cross(&[("origin", "null"), ("host", "127.0.0.1:8090")]));
        let trusted = ["https://app.example.com".to_owned()];
        assert!(!is_cross_origin(
            &post,
            &headers(&[
                ("origin", "https://app.example.com"),
                ("sec-fetch-site", "cross-site")
            ]),
            &trusted
        ));
        assert!(!is_cross_origin(
            &Method::GET,
            &headers(&[("sec-fetch-site", "cross-site")]),
            &[]
        ));
    }
}
