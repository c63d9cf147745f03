//! Signed tokens (`[auth] mode = "jwt"`): the keys loaded at start-up (PEM keys or
//! HMAC secrets from the configuration or `$JWT_VERIFICATION_KEY`, a JWKS file chosen
//! by `kid`), and one check per request by the `jsonwebtoken` crate: the configured
//! algorithm only (so `alg: none`, or a public key used as an HMAC secret, never
//! verifies), the signature, `exp` and `nbf` with agno's 10 s leeway, and `aud` when
//! asked.
//!
//! What a valid token allows is `scopes`' and `auth`'s business, not this module's.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::config::AuthSection;

/// agno's clock-skew tolerance for `exp` and `nbf`, in seconds.
const LEEWAY_S: u64 = 10;

/// Tokens whose signature was verified, remembered (with their claims) so that a
/// caller's next request costs a lookup instead of an RSA or ECDSA verification; when
/// full, the memory is emptied. Bounded: at most this many tokens.
const VERIFIED_TOKENS_MAX: usize = 4096;

/// Tokens longer than this are verified on every use, never remembered, so the memory
/// of verified tokens stays under `VERIFIED_TOKENS_MAX` times this (32 MiB).
const VERIFIED_TOKEN_BYTES_MAX: usize = 8192;

/// What a `401` says: no more than agno says about which check failed.
pub const INVALID: &str = "Invalid authentication token";
/// A token past its `exp`.
pub const EXPIRED: &str = "Token has expired";
/// A token for another audience.
pub const WRONG_AUDIENCE: &str =
    "Invalid token audience - token not valid for this AgentOS instance";

/// The claims turnstile reads from a valid token.
#[derive(Debug, Clone)]
pub struct Claims {
    /// `sub`: the user.
    pub sub: Option<Arc<str>>,
    /// `scopes` (a single string counts as one scope).
    pub scopes: Arc<[String]>,
    /// `exp` and `nbf`, seconds since the epoch, checked again on every use.
    window: (Option<f64>, Option<f64>),
}

impl Claims {
    /// Whether the token is still (or already) valid now, with the leeway.
    fn current(&self) -> Result<(), &'static str> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs_f64())
            .unwrap_or(0.0);
        let leeway = LEEWAY_S as f64;
        match self.window {
            (Some(exp), _) if now > exp + leeway => Err(EXPIRED),
            (_, Some(nbf)) if now + leeway < nbf => Err(INVALID),
            _ => Ok(()),
        }
    }
}

/// The keys and the checks of one server.
pub struct Verifier {
    algorithm: Algorithm,
    validation: Validation,
    /// `verification_keys` (or `$JWT_VERIFICATION_KEY`): each is tried.
    keys: Vec<DecodingKey>,
    /// The JWKS file's keys by `kid`.
    by_kid: HashMap<String, DecodingKey>,
    /// The JWKS file's keys without a `kid`: tried for a token without one.
    unnamed: Vec<DecodingKey>,
    /// Tokens already verified (see [`VERIFIED_TOKENS_MAX`]).
    verified: Mutex<HashMap<Box<str>, Claims>>,
}

impl Verifier {
    /// The verifier of `[auth]`; an error names what is missing or unreadable, so a
    /// server that cannot check tokens never starts.
    pub fn from_config(section: &AuthSection) -> anyhow::Result<Verifier> {
        let algorithm = Algorithm::from_str(&section.algorithm)
            .map_err(|_| anyhow::anyhow!("auth.algorithm {:?} is unknown", section.algorithm))?;
        let mut texts: Vec<(String, String)> = section
            .verification_keys
            .iter()
            .enumerate()
            .map(|(i, key)| (format!("auth.verification_keys[{i}]"), key.clone()))
            .collect();
        if texts.is_empty()
            && let Ok(key) = std::env::var("JWT_VERIFICATION_KEY")
            && !key.is_empty()
        {
            texts.push(("$JWT_VERIFICATION_KEY".into(), key));
        }
        let keys = texts
            .iter()
            .map(|(name, text)| static_key(algorithm, name, text))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let (by_kid, unnamed) = jwks_keys(section, algorithm)?;
        if keys.is_empty() && by_kid.is_empty() && unnamed.is_empty() {
            bail!(
                "auth.mode = \"jwt\" needs a key to verify tokens with, and found none: set auth.verification_keys, $JWT_VERIFICATION_KEY, auth.jwks_file or $JWT_JWKS_FILE"
            );
        }
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY_S;
        // `exp` is checked when present, not required (agno's rule).
        validation.required_spec_claims.clear();
        validation.validate_nbf = true;
        if section.verify_audience {
            validation.set_audience(&[&section.audience]);
            // A token without `aud` is refused too (as agno refuses it).
            validation.set_required_spec_claims(&["aud"]);
        } else {
            validation.validate_aud = false;
        }
        Ok(Verifier {
            algorithm,
            validation,
            keys,
            by_kid,
            unnamed,
            verified: Mutex::new(HashMap::new()),
        })
    }

    /// The claims of a valid token, or what the `401` says. A token verified before
    /// is looked up (the same bytes verify the same way with the same keys, which are
    /// read once at start), and only its times are checked again.
    pub fn verify(&self, token: &str) -> Result<Claims, &'static str> {
        let known = self
            .verified
            .lock()
            .ok()
            .and_then(|verified| verified.get(token).cloned());
        if let Some(claims) = known {
            claims.current()?;
            return Ok(claims);
        }
        let claims = self.verify_signed(token)?;
        if token.len() > VERIFIED_TOKEN_BYTES_MAX {
            return Ok(claims);
        }
        if let Ok(mut verified) = self.verified.lock() {
            if verified.len() >= VERIFIED_TOKENS_MAX {
                verified.clear();
            }
            verified.insert(token.into(), claims.clone());
        }
        Ok(claims)
    }

    /// [`Verifier::verify`] by the signature, with every check of the crate.
    fn verify_signed(&self, token: &str) -> Result<Claims, &'static str> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| INVALID)?;
        if header.alg != self.algorithm {
            return Err(INVALID);
        }
        let named = header.kid.as_deref().and_then(|kid| self.by_kid.get(kid));
        let candidates: Vec<&DecodingKey> = match (named, header.kid.is_some()) {
            (Some(key), _) => vec![key],
            // A `kid` the JWKS does not hold may still be a static key's token.
            (None, true) => self.keys.iter().collect(),
            (None, false) => self.unnamed.iter().chain(&self.keys).collect(),
        };
        let mut claims = None;
        for key in candidates {
            match jsonwebtoken::decode::<Value>(token, key, &self.validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(error) => {
                    use jsonwebtoken::errors::ErrorKind;
                    match error.kind() {
                        // Another key may have signed it.
                        ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => continue,
                        ErrorKind::ExpiredSignature => return Err(EXPIRED),
                        ErrorKind::InvalidAudience => return Err(WRONG_AUDIENCE),
                        _ => return Err(INVALID),
                    }
                }
            }
        }
        let claims = claims.ok_or(INVALID)?;
        let sub = match claims.get("sub") {
            None | Some(Value::Null) => None,
            Some(Value::String(sub)) if !sub.is_empty() => Some(Arc::from(sub.as_str())),
            Some(_) => return Err(INVALID),
        };
        let scopes = match claims.get("scopes") {
            Some(Value::String(scope)) => vec![scope.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or(INVALID)?,
            // The spec makes `scopes` a required claim.
            _ => return Err(INVALID),
        };
        let time = |name: &str| claims.get(name).and_then(Value::as_f64);
        Ok(Claims {
            sub,
            scopes: scopes.into(),
            window: (time("exp"), time("nbf")),
        })
    }
}

/// A JWKS file's keys: by `kid`, and those without one.
type JwksKeys = (HashMap<String, DecodingKey>, Vec<DecodingKey>);

/// The keys of the JWKS file (`jwks_file`, else `$JWT_JWKS_FILE`) that suit the
/// algorithm.
fn jwks_keys(section: &AuthSection, algorithm: Algorithm) -> anyhow::Result<JwksKeys> {
    let jwks_file = section.jwks_file.clone().or_else(|| {
        std::env::var_os("JWT_JWKS_FILE")
            .filter(|path| !path.is_empty())
            .map(Into::into)
    });
    let (mut by_kid, mut unnamed) = (HashMap::new(), Vec::new());
    if let Some(path) = &jwks_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the JWKS file {}", path.display()))?;
        let set: JwkSet = serde_json::from_str(&text).with_context(|| {
            format!("the JWKS file {} is not a JSON Web Key Set", path.display())
        })?;
        for jwk in &set.keys {
            if !same_family(algorithm, &jwk.algorithm)
                || jwk
                    .common
                    .key_algorithm
                    .is_some_and(|alg| format!("{alg:?}") != format!("{algorithm:?}"))
            {
                continue;
            }
            let key = DecodingKey::from_jwk(jwk).with_context(|| {
                format!("a key of the JWKS file {} cannot be used", path.display())
            })?;
            match &jwk.common.key_id {
                Some(kid) => {
                    by_kid.insert(kid.clone(), key);
                }
                None => unnamed.push(key),
            }
        }
        if by_kid.is_empty() && unnamed.is_empty() {
            bail!(
                "the JWKS file {} holds no key for auth.algorithm {:?}",
                path.display(),
                section.algorithm
            );
        }
    }
    Ok((by_kid, unnamed))
}

/// One key of `verification_keys`: an HMAC secret for `HS*`, else a PEM public key of
/// the algorithm's family.
fn static_key(algorithm: Algorithm, name: &str, text: &str) -> anyhow::Result<DecodingKey> {
    let pem = text.as_bytes();
    match algorithm {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            if text.trim_start().starts_with("-----BEGIN") {
                bail!("{name} is a PEM key, but auth.algorithm {algorithm:?} needs an HMAC secret");
            }
            Ok(DecodingKey::from_secret(pem))
        }
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 => DecodingKey::from_rsa_pem(pem)
            .with_context(|| format!("{name} is not a PEM RSA public key")),
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(pem)
            .with_context(|| format!("{name} is not a PEM EC public key")),
        other => bail!("auth.algorithm {other:?} is not supported"),
    }
}

/// Whether a JWK's key type suits the algorithm.
fn same_family(algorithm: Algorithm, parameters: &AlgorithmParameters) -> bool {
    matches!(
        (algorithm, parameters),
        (
            Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512,
            AlgorithmParameters::RSA(_)
        ) | (
            Algorithm::ES256 | Algorithm::ES384,
            AlgorithmParameters::EllipticCurve(_)
        ) | (
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512,
            AlgorithmParameters::OctetKey(_)
        )
    )
}
