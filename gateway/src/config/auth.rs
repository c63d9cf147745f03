//! `[auth]`: how callers prove who they are (spec `authorization.md`): the shared API
//! key of `server.api_key_env` (the default), or signed tokens (`mode = "jwt"`) with
//! agno's scopes and, when asked, per-user isolation.
//!
//! This module only parses and prints the section; `crate::auth` loads the keys and
//! checks requests.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Which way callers authenticate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// The API key of `server.api_key_env` when that variable is set, else open.
    #[default]
    Key,
    /// Signed tokens (JWT) with scopes.
    Jwt,
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// `key` (default) or `jwt`.
    pub mode: AuthMode,
    /// jwt: PEM public keys, or HMAC secrets for the `HS*` algorithms; when empty,
    /// `$JWT_VERIFICATION_KEY`.
    pub verification_keys: Vec<String>,
    /// jwt: a JWKS file whose keys are chosen by the token's `kid`; when absent,
    /// `$JWT_JWKS_FILE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<PathBuf>,
    /// jwt: the one algorithm tokens are signed with.
    pub algorithm: String,
    /// jwt: whether the `aud` claim must name `audience`.
    pub verify_audience: bool,
    /// jwt: the audience tokens must name when `verify_audience` is on.
    pub audience: String,
    /// jwt: the scope that grants every route and sees every user's sessions.
    pub admin_scope: String,
    /// jwt: each caller sees and drives only the sessions of its token's `sub`.
    pub user_isolation: bool,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            mode: AuthMode::Key,
            verification_keys: Vec::new(),
            jwks_file: None,
            algorithm: "RS256".into(),
            verify_audience: false,
            audience: "turnstile".into(),
            admin_scope: "agent_os:admin".into(),
            user_isolation: false,
        }
    }
}

/// The algorithms `algorithm` accepts (the spec's list).
pub const ALGORITHMS: [&str; 8] = [
    "RS256", "RS384", "RS512", "ES256", "ES384", "HS256", "HS384", "HS512",
];

impl AuthSection {
    /// What `check` refuses: an algorithm outside the spec's list, or jwt-only keys
    /// set in key mode (a half-written switch to tokens would otherwise run open).
    pub fn check(&self) -> Result<(), String> {
        if !ALGORITHMS.contains(&self.algorithm.as_str()) {
            return Err(format!(
                "auth.algorithm must be one of {}, got {:?}",
                ALGORITHMS.join(", "),
                self.algorithm
            ));
        }
        if self.mode == AuthMode::Key
            && (!self.verification_keys.is_empty()
                || self.jwks_file.is_some()
                || self.user_isolation)
        {
            return Err(
                "auth.verification_keys, auth.jwks_file and auth.user_isolation apply to auth.mode = \"jwt\"; set mode = \"jwt\" (or remove them)"
                    .into(),
            );
        }
        if self.admin_scope.trim().is_empty() {
            return Err("auth.admin_scope must not be empty".into());
        }
        Ok(())
    }

    /// The section as `--print-config` shows it: HMAC secrets masked (a PEM public
    /// key is not a secret and stays readable).
    pub fn masked(&self) -> AuthSection {
        let mut masked = self.clone();
        for key in &mut masked.verification_keys {
            if !key.trim_start().starts_with("-----BEGIN PUBLIC KEY-----")
                && !key
                    .trim_start()
                    .starts_with("-----BEGIN RSA PUBLIC KEY-----")
            {
                *key = super::MASKED.into();
            }
        }
        masked
    }
}
