//! Approval through the MCP client (docs/mcp.md, "Approval through elicitation"): a
//! `tools/call` whose call waits for a person's approval ([`Error::AwaitingApproval`]:
//! nothing ran) asks that person through the client when the client can be asked, stores
//! the answer as the decision ([`approval::decide`], channel
//! [`MCP_ELICITATION`](approval::channel::MCP_ELICITATION)), and answers with what the call
//! does then:
//!
//! - **accept**: approved; the same call runs again through the registry, so its body runs
//!   once and the `tools/call` answers with its result (a retry replays it, asking nothing);
//! - **decline**: denied; the call run again answers with the stored denial (`denied`),
//!   which every retry of the intent gets without a new question;
//! - **cancel**, or no usable answer (the client failed, timed out, or sent an answer that
//!   does not decode): nothing is decided; the answer is the `awaiting_approval` tool error
//!   naming the operation, which any other channel can still decide.
//!
//! How the client is asked follows the negotiated protocol version: `elicitation/create` on
//! the session up to 2025-11-25; from 2026-07-28 on, where a server sends the client no
//! requests (SEP-2322), an `InputRequiredResult` carrying the same elicitation, answered
//! with the client's retry of the `tools/call` (`inputResponses` and the echoed
//! `requestState`). A client that declared no form elicitation gets the `awaiting_approval`
//! tool error at once.
//!
//! The decision is always made on the key the call itself derives, never on one the client
//! names: `requestState` only tells which question an answer belongs to, and an answer
//! whose state names another key (the arguments changed between rounds) is a new question.

use core::time::Duration;
use std::collections::BTreeMap;

use rmcp::model::{
    CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, InputRequest, InputRequiredResult, InputResponses, ProtocolVersion,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use rmcp::ErrorData;
use serde_json::{json, Map, Value};

use super::{operation_uri, McpServer};
use crate::approval::{self, channel, Verdict};
use crate::error::Error;

/// How long the server waits for the client's answer to an `elicitation/create` by default
/// (never longer than the approval request stays open): a person reads and decides, so
/// minutes, not the seconds of a tool call. See
/// [`McpServer::with_elicitation_timeout`](super::McpServer::with_elicitation_timeout).
pub const DEFAULT_ELICITATION_TIMEOUT: Duration = Duration::from_secs(600);

/// The id of the approval question among an `InputRequiredResult`'s `inputRequests`, and
/// the `_meta` key of the elicitation's machine-readable part (`key`, `tool`, `operation`,
/// `arguments`, `expiresAt`).
pub const APPROVAL_META_KEY: &str = "dev.tool-contracts/approval";

/// The prefix of the `requestState` of an approval question; the call's key follows.
const REQUEST_STATE_PREFIX: &str = "dev.tool-contracts/approval/v1:";

/// The reason a decline is stored with when the person gave none.
pub(super) const DECLINED: &str = "declined in the MCP client";

/// The longest rendering of the call's arguments in the question, in characters (the
/// elicitation's `_meta` and the operation carry them whole).
const ARGUMENTS_SHOWN: usize = 1_500;

/// The longest reason kept, in characters (what [`approval::decide`] accepts).
const REASON_MAX: usize = 1_024;

/// How the client of one `tools/call` can be asked for an approval, and who answers.
pub(super) struct Asker {
    how: How,
    /// Who decides, as the decision names them: `mcp-client:<clientInfo.name>`.
    by: String,
}

enum How {
    /// Not at all: no form elicitation declared, or the server's channel is off.
    Not,
    /// `elicitation/create` on the client's session (protocol up to 2025-11-25).
    Request(Peer<RoleServer>),
    /// An `InputRequiredResult` (2026-07-28 on): the answer, if any, came with this
    /// request.
    InputRequired {
        responses: Option<InputResponses>,
        state: Option<String>,
    },
}

/// What became of the question.
enum Reply {
    /// The client answered.
    Answered(ElicitResult),
    /// No usable answer; the text says why (for the model and the operator).
    Unanswered(String),
}

impl Asker {
    /// An asker that never asks: the call answers `awaiting_approval`.
    pub(super) fn none() -> Asker {
        Asker {
            how: How::Not,
            by: String::new(),
        }
    }

    /// Whether this client can be asked at all ([`answer_awaiting`](McpServer::answer_awaiting)
    /// answers the `awaiting_approval` tool error at once when it cannot).
    pub(super) fn can_ask(&self) -> bool {
        !matches!(self.how, How::Not)
    }

    /// How the client of this request can be asked: by the capabilities it declared (at
    /// `initialize`, or in this request's `_meta` from 2026-07-28 on) and the negotiated
    /// version. `responses` and `state` are the request's `inputResponses` and
    /// `requestState`.
    pub(super) fn of(
        context: &RequestContext<RoleServer>,
        responses: Option<InputResponses>,
        state: Option<String>,
    ) -> Asker {
        let form = context
            .client_capabilities()
            .and_then(|capabilities| capabilities.elicitation)
            // A declaration naming neither mode means form (the 2025-06-18 shape).
            .is_some_and(|e| e.form.is_some() || e.url.is_none());
        if !form {
            return Asker::none();
        }
        let stateless = context
            .protocol_version()
            .is_some_and(|version| version >= ProtocolVersion::NO_INITIALIZE);
        let how = match stateless {
            true => How::InputRequired { responses, state },
            false => How::Request(context.peer.clone()),
        };
        Asker {
            how,
            by: decider(context.client_info().map(|info| info.name)),
        }
    }
}

/// `mcp-client:<name>`, from the client's self-declared `clientInfo.name` (control
/// characters dropped, at most 200 characters; `unnamed` if it gave none).
pub(super) fn decider(name: Option<String>) -> String {
    let name: String = name
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    match name.trim() {
        "" => "mcp-client:unnamed".to_owned(),
        name => format!("mcp-client:{name}"),
    }
}

/// The reason a person typed, as a decision stores it: control characters (line breaks)
/// as spaces, trimmed, at most 1024 characters; `None` when empty or absent.
pub(super) fn reason_of(content: Option<&Value>) -> Option<String> {
    let text = content?.get("reason")?.as_str()?;
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(REASON_MAX)
        .collect();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The `requestState` of the question about the call `key`.
pub(super) fn state_of(key: &str) -> String {
    format!("{REQUEST_STATE_PREFIX}{key}")
}

/// The answer, among a retry's `inputResponses`, to the question about the call `key`:
/// `None` when this request answers no question about it (first round, another key's
/// state, or no answer under [`APPROVAL_META_KEY`]).
fn reply_in(responses: Option<&InputResponses>, state: Option<&str>, key: &str) -> Option<Reply> {
    if state != Some(state_of(key).as_str()) {
        return None;
    }
    let answer = responses?.get(APPROVAL_META_KEY)?;
    Some(match serde_json::from_value::<ElicitResult>(answer.clone()) {
        Ok(result) => Reply::Answered(result),
        Err(e) => Reply::Unanswered(format!(
            "The MCP client's answer to the approval question does not decode as an elicitation result ({e})"
        )),
    })
}

/// `text` cut to `max` characters, saying so.
fn shortened(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}… (cut; the operation has it whole)", &text[..end]),
        None => text.to_owned(),
    }
}

impl McpServer {
    /// The answer to a call waiting for approval (`pending`, its [`Error::AwaitingApproval`]):
    /// asks the person through the client if `asker` can, stores their answer and runs the
    /// call again (see the module docs); otherwise the `awaiting_approval` tool error.
    pub(super) async fn answer_awaiting(
        &self,
        name: &str,
        args: Value,
        client_key: Option<&str>,
        pending: Error,
        asker: Asker,
    ) -> Result<CallToolResponse, ErrorData> {
        let (key, expires_in) = match &pending {
            Error::AwaitingApproval {
                key, expires_in_ms, ..
            } => (key.clone(), Duration::from_millis(*expires_in_ms)),
            _ => return self.answer(name, Err(pending), client_key).map(Into::into),
        };
        let Asker { how, by } = asker;
        let reply = match how {
            How::Not => return Ok(self.error_result(name, pending, client_key).into()),
            How::InputRequired { responses, state } => {
                match reply_in(responses.as_ref(), state.as_deref(), &key) {
                    Some(reply) => reply,
                    None => match self.question(name, &key, client_key).await {
                        Ok(question) => {
                            let requests = BTreeMap::from([(
                                APPROVAL_META_KEY.to_owned(),
                                InputRequest::Elicitation(ElicitRequest::new(question)),
                            )]);
                            tracing::debug!(tool = name, key = %key, "tool-contracts: asking for approval with an input_required result");
                            return Ok(InputRequiredResult::new(
                                Some(requests),
                                Some(state_of(&key)),
                            )
                            .into());
                        }
                        Err(why) => Reply::Unanswered(why),
                    },
                }
            }
            How::Request(peer) => match self.question(name, &key, client_key).await {
                Ok(question) => {
                    let timeout = self.inner.elicitation_timeout.min(expires_in);
                    tracing::debug!(tool = name, key = %key, "tool-contracts: asking for approval with elicitation/create");
                    match peer
                        .create_elicitation_with_timeout(question, Some(timeout))
                        .await
                    {
                        Ok(result) => Reply::Answered(result),
                        Err(e) => Reply::Unanswered(format!(
                            "The MCP client gave no answer to the approval question ({e})"
                        )),
                    }
                }
                Err(why) => Reply::Unanswered(why),
            },
        };
        let result = match reply {
            Reply::Answered(result) => result,
            Reply::Unanswered(why) => {
                tracing::info!(tool = name, key = %key, why = %why, "tool-contracts: approval not answered through the MCP client; still pending");
                return Ok(self.still_pending(name, pending, client_key, &why).into());
            }
        };
        let reason = reason_of(result.content.as_ref());
        let verdict = match result.action {
            ElicitationAction::Accept => Verdict::Approved,
            ElicitationAction::Decline => Verdict::Denied,
            // Cancel, and any action a later protocol adds: nothing decided.
            _ => {
                let why = "The person cancelled the approval question in the MCP client";
                return Ok(self.still_pending(name, pending, client_key, why).into());
            }
        };
        let reason = match verdict {
            Verdict::Denied => Some(reason.unwrap_or_else(|| DECLINED.to_owned())),
            Verdict::Approved => reason,
        };
        let decided = self
            .as_caller(
                client_key,
                approval::decide(
                    &key,
                    verdict,
                    &by,
                    channel::MCP_ELICITATION,
                    reason.as_deref(),
                ),
            )
            .await;
        match (decided, verdict) {
            (Ok(_), _) => {}
            // Approved here but decided otherwise first, or the request expired: the store's
            // answer stands, and the call run again reports it (the denial, or a new request).
            (Err(Error::NoPendingApproval { .. }), Verdict::Approved) => {}
            // A decline that did not stand (approved first elsewhere, or expired) must not
            // run the call: say why.
            (Err(e), _) => return Ok(self.error_result(name, e, client_key).into()),
        }
        // The call again, exactly as the client made it: approved, its body runs once; denied,
        // the stored denial comes back.
        let outcome = self.run_call(name, args, client_key).await;
        self.answer(name, outcome, client_key).map(Into::into)
    }

    /// The `awaiting_approval` tool error after a question that got no decision, saying why
    /// first.
    fn still_pending(
        &self,
        name: &str,
        pending: Error,
        client_key: Option<&str>,
        why: &str,
    ) -> rmcp::model::CallToolResult {
        let key = pending.key().unwrap_or_default().to_owned();
        let mut result = self.error_result(name, pending, client_key);
        result.content.insert(
            0,
            rmcp::model::ContentBlock::text(format!(
                "{why}: nothing was decided, and operation {key} is still awaiting approval ({}).",
                operation_uri(&key)
            )),
        );
        result
    }

    /// The question about the call `key` of `name`: the tool, the intent (the arguments as
    /// stored: a `Secret` as its digest), the consequences and the operation link, with a
    /// form asking for an optional reason. `Err` says why none can be asked.
    async fn question(
        &self,
        name: &str,
        key: &str,
        client_key: Option<&str>,
    ) -> Result<ElicitRequestParams, String> {
        let request = match self
            .as_caller(client_key, approval::approval_request(key))
            .await
        {
            Ok(Some(request)) => request,
            Ok(None) => {
                return Err(
                    "The approval request could not be read back to ask about it (it expired or was decided meanwhile)"
                        .to_owned(),
                )
            }
            Err(e) => {
                return Err(format!(
                    "The approval request could not be read to ask about it ({e})"
                ))
            }
        };
        let tool = self.inner.registry.get(name);
        let arguments = serde_json::to_string(&request.arguments).unwrap_or_default();
        let keyed_by = tool
            .map(|t| t.idempotency_key_fields().join(", "))
            .filter(|fields| !fields.is_empty())
            .map(|fields| format!(" (one intent per {fields})"))
            .unwrap_or_default();
        let about = tool
            .map(|t| t.description().trim())
            .filter(|d| !d.is_empty())
            .map(|d| format!("\n\nAbout the tool: {d}"))
            .unwrap_or_default();
        let denial = tool.map_or_else(String::new, |t| {
            format!(" for {}", humantime::format_duration(t.ttl()))
        });
        let link = operation_uri(key);
        let expires = crate::operation::rfc3339_text(request.approval.expires_at);
        let message = format!(
            "Approve this call of `{name}`?\n\n\
             What it would do: `{name}` with {}{keyed_by}.{about}\n\n\
             If you approve, it runs once: retries of the same call return its result without running it again. \
             If you decline, it does not run, and every retry of this intent gets the denial{denial}. \
             If you cancel, nothing is decided: it stays pending until {expires}, and can be approved elsewhere.\n\n\
             Operation: {link}",
            shortened(&arguments, ARGUMENTS_SHOWN),
        );
        let schema = ElicitationSchema::builder()
            .optional_string_with("reason", |s| {
                s.title("Reason (optional)")
                    .description("Why you approve or decline: kept with the decision in the operation's history, and shown to the agent with a denial.")
                    .max_length(REASON_MAX as u32)
            })
            .build()
            .map_err(|e| format!("The approval form could not be built ({e})"))?;
        let mut meta = Map::new();
        meta.insert(
            APPROVAL_META_KEY.to_owned(),
            json!({
                "key": key,
                "tool": name,
                "operation": link,
                "arguments": request.arguments,
                "expiresAt": expires,
            }),
        );
        Ok(ElicitRequestParams::FormElicitationParams {
            meta: Some(meta.into()),
            message,
            requested_schema: schema,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decider_is_the_clients_name_cleaned() {
        assert_eq!(decider(Some("claude-ai".into())), "mcp-client:claude-ai");
        assert_eq!(decider(Some(" a\nb ".into())), "mcp-client:ab");
        assert_eq!(decider(None), "mcp-client:unnamed");
        assert_eq!(decider(Some("\u{7}".into())), "mcp-client:unnamed");
        assert_eq!(decider(Some("x".repeat(300))).chars().count(), 211);
    }

    #[test]
    fn a_reason_is_one_line_of_at_most_1024_characters() {
        assert_eq!(
            reason_of(Some(&json!({"reason": " ok\nfine "}))).as_deref(),
            Some("ok fine")
        );
        assert_eq!(reason_of(Some(&json!({"reason": "  "}))), None);
        assert_eq!(reason_of(Some(&json!({"reason": 7}))), None);
        assert_eq!(reason_of(Some(&json!({}))), None);
        assert_eq!(reason_of(None), None);
        let long = reason_of(Some(&json!({"reason": "é".repeat(2000)}))).unwrap();
        assert_eq!(long.chars().count(), REASON_MAX);
    }

    #[test]
    fn an_answer_counts_only_for_the_question_about_the_same_key() {
        let responses: InputResponses =
            BTreeMap::from([(APPROVAL_META_KEY.to_owned(), json!({"action": "accept"}))]);
        let state = state_of("k1");
        assert!(matches!(
            reply_in(Some(&responses), Some(&state), "k1"),
            Some(Reply::Answered(ElicitResult {
                action: ElicitationAction::Accept,
                ..
            }))
        ));
        // Another key's state (the arguments changed), no state, no answer: a new question.
        assert!(reply_in(Some(&responses), Some(&state), "k2").is_none());
        assert!(reply_in(Some(&responses), None, "k1").is_none());
        assert!(reply_in(None, Some(&state), "k1").is_none());
        let garbled: InputResponses =
            BTreeMap::from([(APPROVAL_META_KEY.to_owned(), json!({"action": "maybe"}))]);
        assert!(matches!(
            reply_in(Some(&garbled), Some(&state), "k1"),
            Some(Reply::Unanswered(_))
        ));
    }

    #[test]
    fn long_arguments_are_cut_on_a_character_boundary() {
        assert_eq!(shortened("abc", 3), "abc");
        let cut = shortened(&"é".repeat(10), 4);
        assert!(cut.starts_with("éééé…"), "{cut}");
    }
}
