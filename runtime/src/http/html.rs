//! The HTML pages a browser gets instead of JSON: an operation (with the forms that decide
//! a call awaiting approval), and a problem. No script, no external resource, and
//! everything shown escaped: results, arguments, names and reasons are user data.

use core::fmt::Write as _;

use serde_json::Value;

use super::problem::Problem;
use crate::operation::{Operation, OperationState};

/// `text` with the five characters that matter in HTML element content and quoted
/// attribute values replaced by references (the OWASP rule for both contexts).
/// Hand-written: a template engine would bring a proc-macro stack for two small pages, and
/// this rule is all they need.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            _ => out.push(c),
        }
    }
    out
}

/// The pages' only styling, inline (no external resource): a readable column, the key
/// wrapped instead of overflowing, the fields as a two-column list, the state as a callout
/// coloured by `data-state`.
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:48rem;margin:2rem auto;padding:0 1rem;line-height:1.4}\
h1 code{display:block;font-size:.6em;overflow-wrap:anywhere}\
#state{padding:.6rem .8rem;border-left:.3rem solid #888;background:#f6f6f6}\
#state[data-state=completed]{border-color:#2e7d32;background:#edf7ee}\
#state[data-state=in_progress]{border-color:#1565c0;background:#e8f0fb}\
#state[data-state=failed],#state[data-state=unknown],#state[data-state=denied]{border-color:#c62828;background:#fbeaea}\
#state[data-state=awaiting_approval],#state[data-state=approved]{border-color:#ef6c00;background:#fff3e0}\
form{margin:.8rem 0;padding:.6rem .8rem;border:1px solid #ddd}label{display:block;margin:.3rem 0}textarea{width:100%;min-height:3rem}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem}dt{font-weight:bold}dd{margin:0}\
pre{background:#f4f4f4;padding:.75rem;overflow:auto}table{border-collapse:collapse}td,th{padding:.2rem .6rem;text-align:left}";

/// A whole page: `title` and `body` (already HTML), with a refresh after `refresh` seconds
/// when the page shows something still running.
fn page(title: &str, body: &str, refresh: Option<u64>) -> String {
    let refresh = refresh
        .map(|s| format!("<meta http-equiv=\"refresh\" content=\"{s}\">\n"))
        .unwrap_or_default();
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n{refresh}<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        title = escape(title),
    )
}

/// What a person reads for each state.
fn state_sentence(state: OperationState) -> &'static str {
    match state {
        OperationState::Completed => {
            "Done. This is the stored result: reloading this page, or sending the same request again, does not run it again."
        }
        OperationState::InProgress => "Still running. This page reloads itself until it is done.",
        OperationState::Failed => {
            "The call failed with the error below, which is stored: sending the same request again returns the same error."
        }
        OperationState::Unknown => {
            "The outcome is unknown: the call stopped midway (its server died), so its effect may or may not have happened. It will not run again by itself; an operator must check and resolve it."
        }
        OperationState::Compensating => "The task failed and its completed steps are being undone. This page reloads itself until it is done.",
        OperationState::Compensated => "The task failed and every completed step was undone, as listed below.",
        OperationState::NeedsIntervention => {
            "The task failed and was undone as far as it could be: the steps marked below could not be undone (no undo, a failed undo, or an unknown outcome). An operator must finish the job."
        }
        OperationState::AwaitingApproval => {
            "Waiting for a person's approval. Nothing has run yet: approving it runs the call, once; denying it means every retry of it gets the denial."
        }
        OperationState::Approved => {
            "Approved. Nothing has run yet: sending the same request again runs it, once."
        }
        OperationState::Denied => {
            "Denied. Nothing ran, and sending the same request again returns the same denial."
        }
    }
}

/// Who may decide a call awaiting approval from this page (`decide.rs` asks the router's
/// approver function about the reader).
pub(super) enum Who {
    /// The router takes no decisions over HTTP: the page says how to decide instead.
    Disabled,
    /// The approver function refuses this reader: no forms.
    Refused,
    /// The approver function names the reader: forms without a name field.
    Named(String),
    /// The body names who decides: forms with a name field.
    Ask,
}

/// What the page of an operation awaiting approval shows to decide it.
pub(super) struct Asking {
    /// The call's arguments, as its request stored them.
    pub(super) arguments: Value,
    /// Where the approve form posts.
    pub(super) approve: String,
    /// Where the deny form posts.
    pub(super) deny: String,
    /// Who decides.
    pub(super) who: Who,
    /// The longest reason accepted.
    pub(super) max_reason: usize,
}

/// The approval section: where it stands and, once decided, who decided, when, through
/// which channel and why; then, while it waits, the arguments and the forms.
fn approval_section(body: &mut String, op: &Operation, doc: &Value, asking: Option<&Asking>) {
    let Some(approval) = doc.get("approval") else {
        return;
    };
    let text = |value: Option<&Value>| match value {
        Some(Value::String(s)) => escape(s),
        Some(Value::Null) | None => String::new(),
        Some(other) => escape(&other.to_string()),
    };
    body.push_str("<h2>Approval</h2>\n<dl id=\"approval\">\n");
    let mut row = |name: &str, id: &str, value: String| {
        let _ = writeln!(body, "<dt>{name}</dt><dd id=\"{id}\">{value}</dd>");
    };
    row("approval", "approval-state", text(approval.get("state")));
    row(
        "requested at",
        "approval-requested-at",
        format!("<time>{}</time>", text(approval.get("requested_at"))),
    );
    if let Some(decision) = approval.get("decision") {
        row("decision", "decision", text(decision.get("verdict")));
        row("by", "decided-by", text(decision.get("by")));
        row(
            "at",
            "decided-at",
            format!("<time>{}</time>", text(decision.get("at"))),
        );
        row("through", "decided-via", text(decision.get("channel")));
        if decision.get("reason").is_some() {
            row("reason", "decision-reason", text(decision.get("reason")));
        }
    } else {
        row(
            "expires at",
            "approval-expires-at",
            format!("<time>{}</time>", text(approval.get("expires_at"))),
        );
    }
    body.push_str("</dl>\n");
    let (Some(asking), OperationState::AwaitingApproval) = (asking, op.state) else {
        return;
    };
    let _ = writeln!(
        body,
        "<h3>Arguments</h3>\n<pre id=\"arguments\">{}</pre>",
        escape(&pretty(&asking.arguments))
    );
    let name_field = |id: &str| {
        match &asking.who {
        Who::Ask => format!("<label>Your name <input id=\"{id}\" name=\"by\" required maxlength=\"256\" autocomplete=\"name\"></label>\n"),
        _ => String::new(),
    }
    };
    match &asking.who {
        Who::Disabled => {
            let _ = writeln!(
                body,
                "<p id=\"decide\">This server does not take decisions over HTTP: decide with <code>tool-contracts approve {0}</code> or <code>tool-contracts deny {0}</code>.</p>",
                escape(&op.key)
            );
            return;
        }
        Who::Refused => {
            body.push_str("<p id=\"decide\">You may not decide this request here.</p>\n");
            return;
        }
        Who::Named(name) => {
            let _ = writeln!(
                body,
                "<p id=\"decide\">Deciding as <strong>{}</strong>.</p>",
                escape(name)
            );
        }
        Who::Ask => {}
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"{approve}\" id=\"approve-form\">\n{approve_name}<button type=\"submit\" id=\"approve\">Approve</button>\n</form>\n\
<form method=\"post\" action=\"{deny}\" id=\"deny-form\">\n{deny_name}<label>Reason <textarea id=\"deny-reason\" name=\"reason\" required maxlength=\"{max}\"></textarea></label>\n<button type=\"submit\" id=\"deny\">Deny</button>\n</form>\n",
        approve = escape(&asking.approve),
        deny = escape(&asking.deny),
        approve_name = name_field("approve-by"),
        deny_name = name_field("deny-by"),
        max = asking.max_reason,
    );
}

/// The operation page; `refresh` while the call runs; `asking` while it awaits approval.
pub(super) fn operation_page(
    op: &Operation,
    refresh: Option<u64>,
    asking: Option<&Asking>,
) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>Operation <code>{}</code></h1>\n<p id=\"state\" data-state=\"{}\">{}</p>\n<dl>",
        escape(&op.key),
        op.state.as_str(),
        escape(state_sentence(op.state)),
    );
    let times = serde_json::to_value(op).unwrap_or(Value::Null);
    let mut row = |name: &str, value: String| {
        let _ = writeln!(body, "<dt>{}</dt><dd>{}</dd>", escape(name), value);
    };
    row("tool", format!("<code>{}</code>", escape(&op.tool)));
    row("state", escape(op.state.as_str()));
    if let Some(version) = op.version {
        row("version", version.to_string());
    }
    for member in ["created_at", "updated_at", "expires_at"] {
        if let Some(at) = times.get(member).and_then(Value::as_str) {
            row(member, format!("<time>{}</time>", escape(at)));
        }
    }
    if let Some(lease) = op.lease_remaining {
        row("lease remaining", format!("{} ms", lease.as_millis()));
    }
    body.push_str("</dl>\n");
    approval_section(&mut body, op, &times, asking);
    if let Some(result) = &op.result {
        let _ = writeln!(
            body,
            "<h2>Result</h2>\n<pre id=\"result\">{}</pre>",
            escape(&pretty(result))
        );
    }
    if let Some(error) = &op.error {
        let _ = writeln!(
            body,
            "<h2>Error</h2>\n<pre id=\"error\">{}</pre>",
            escape(&pretty(error))
        );
    }
    if let Some(history) = times.get("history").and_then(Value::as_array) {
        body.push_str("<h2>History</h2>\n<table>\n<tr><th>at</th><th>event</th><th>token</th><th>worker</th></tr>\n");
        for event in history {
            let cell = |name: &str| match event.get(name) {
                Some(Value::String(s)) => escape(s),
                Some(Value::Null) | None => String::new(),
                Some(other) => escape(&other.to_string()),
            };
            let _ = writeln!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                cell("at"),
                cell("kind"),
                cell("token"),
                cell("worker")
            );
        }
        body.push_str("</table>\n");
    }
    page(&format!("Operation {}", op.key), &body, refresh)
}

/// The problem page: its title, detail and members.
pub(super) fn problem_page(problem: &Problem) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>{} {}</h1>",
        problem.status().as_u16(),
        escape(problem.title())
    );
    if let Some(detail) = problem.detail() {
        let _ = writeln!(body, "<p id=\"detail\">{}</p>", escape(detail));
    }
    if let Some(operation) = problem.extension("operation").and_then(Value::as_str) {
        let _ = writeln!(
            body,
            "<p><a href=\"{0}\">See the operation</a> instead of sending the request again.</p>",
            escape(operation)
        );
    }
    let _ = writeln!(
        body,
        "<pre id=\"problem\">{}</pre>",
        escape(&pretty(&problem.to_json()))
    );
    page(problem.title(), &body, None)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_five_characters_are_escaped() {
        assert_eq!(
            escape(r#"<script>alert('x' & "y")</script>"#),
            "&lt;script&gt;alert(&#x27;x&#x27; &amp; &quot;y&quot;)&lt;/script&gt;"
        );
        assert_eq!(escape("plain ✓"), "plain ✓");
    }
}
