//! `GET /approvals`: the tool calls waiting for a person's decision, across sessions,
//! oldest pause first, paginated like `/sessions` (`spec/approvals.md`). A caller under
//! per-user isolation sees its own sessions' calls only.

use super::extract::Query;
use super::{AppState, owner_of, positive};
use crate::api::error::{ApiError, ErrorBody};
use crate::auth::Caller;
use crate::wire::dto::{self, ApprovalPage};
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use turnstile_journal::SessionId;
use utoipa::IntoParams;

/// The filters and page of `GET /approvals`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalsQuery {
    /// Only this agent's calls.
    agent_id: Option<String>,
    /// Only this session's calls.
    session_id: Option<String>,
    /// Calls per page, 1 to 1,000 (default 20).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The page, from 1 (default 1).
    #[param(value_type = Option<u32>, minimum = 1)]
    page: Option<String>,
}

#[utoipa::path(
    get, path = "/approvals", tag = "runs", summary = "Tool calls waiting for a decision, oldest first",
    params(ApprovalsQuery),
    responses((status = 200, description = "A page of pending calls", body = ApprovalPage), (status = 401, description = "Missing or invalid API key (when one is configured)", body = ErrorBody), (status = 422, description = "A field or parameter that does not parse, is over its bound, or is unknown", body = ErrorBody))
)]
pub(super) async fn list_approvals(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<ApprovalsQuery>,
) -> Result<Json<ApprovalPage>, ApiError> {
    let limit = positive("limit", query.limit.as_deref(), 20, 1_000)?;
    let page = positive("page", query.page.as_deref(), 1, 1_000_000)?;
    let runs = match query.session_id.as_deref().map(SessionId::parse) {
        // No session of that id can have a paused run.
        Some(Err(_)) => Vec::new(),
        session_id => {
            let session_id = session_id.and_then(Result::ok);
            tokio::task::block_in_place(|| {
                state
                    .runtime
                    .paused_runs(query.agent_id.as_deref(), session_id.as_ref())
            })?
        }
    };
    let mut pending = Vec::new();
    for run in runs {
        if caller.owner().is_some() {
            let owner = owner_of(&state, &run.session_id)?;
            if !owner.is_some_and(|user| caller.sees(user.as_deref())) {
                continue;
            }
        }
        let paused_at = run.paused_at_us.unwrap_or(run.updated_at_us);
        for call in &run.pending {
            pending.push(dto::pending_approval(&run, call, paused_at));
        }
    }
    let total_count = pending.len();
    let data = pending
        .into_iter()
        .skip((page - 1).saturating_mul(limit))
        .take(limit)
        .collect();
    Ok(Json(ApprovalPage {
        data,
        meta: dto::PageMeta {
            page,
            limit,
            total_pages: total_count.div_ceil(limit),
            total_count,
        },
    }))
}
