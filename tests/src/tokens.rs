//! Signed tokens for the tests of `[auth] mode = "jwt"`: keys made per test by the
//! `openssl` command (RSA 2048 and P-256, as an identity provider makes them), tokens
//! signed by the `jsonwebtoken` crate, and the forged ones a server must refuse
//! (`alg: none`, a public key used as an HMAC secret).

use std::process::Command;

use base64::Engine;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// A key pair in PEM.
#[derive(Debug, Clone)]
pub struct KeyPair {
    /// PKCS#8 private key.
    pub private_pem: String,
    /// SubjectPublicKeyInfo public key.
    pub public_pem: String,
    /// The algorithm it signs with.
    pub algorithm: Algorithm,
}

fn openssl(args: &[&str], input: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        // Key generation prints progress dots.
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the token tests need the openssl command (.ci/run installs it)");
    if let Some(input) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "openssl {args:?} failed");
    String::from_utf8(output.stdout).unwrap()
}

fn pair(genpkey: &[&str], algorithm: Algorithm) -> KeyPair {
    let private_pem = openssl(genpkey, None);
    let public_pem = openssl(&["pkey", "-pubout"], Some(&private_pem));
    KeyPair {
        private_pem,
        public_pem,
        algorithm,
    }
}

/// A fresh RSA 2048 key (RS256).
pub fn rsa() -> KeyPair {
    pair(
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ],
        Algorithm::RS256,
    )
}

/// A fresh P-256 key (ES256).
pub fn ec() -> KeyPair {
    pair(
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ],
        Algorithm::ES256,
    )
}

impl KeyPair {
    fn encoding_key(&self) -> EncodingKey {
        match self.algorithm {
            Algorithm::ES256 | Algorithm::ES384 => {
                EncodingKey::from_ec_pem(self.private_pem.as_bytes()).unwrap()
            }
            _ => EncodingKey::from_rsa_pem(self.private_pem.as_bytes()).unwrap(),
        }
    }

    /// A token signed by this key, with `kid` in its header when given.
    pub fn sign(&self, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(self.algorithm);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &self.encoding_key()).unwrap()
    }

    /// The public key as a JWK named `kid`.
    pub fn jwk(&self, kid: &str) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.encoding_key(), self.algorithm).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        jwk
    }
}

/// A JWKS document of these keys.
pub fn jwks(keys: &[(&str, &KeyPair)]) -> String {
    let set = JwkSet {
        keys: keys.iter().map(|(kid, key)| key.jwk(kid)).collect(),
    };
    serde_json::to_string(&set).unwrap()
}

/// A token signed with an HMAC secret.
pub fn hmac(algorithm: Algorithm, secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &Header::new(algorithm),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap()
}

/// An unsigned token (`alg: none`), which no server may accept.
pub fn unsigned(claims: &Value) -> String {
    let b64 =
        |value: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
    format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(claims)
    )
}

/// Seconds since the epoch.
pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Claims for `sub` (none when `None`) with `scopes`, valid for an hour.
pub fn claims(sub: Option<&str>, scopes: &[&str]) -> Value {
    let mut claims = json!({"scopes": scopes, "iat": now_s(), "exp": now_s() + 3600});
    if let Some(sub) = sub {
        claims["sub"] = json!(sub);
    }
    claims
}
