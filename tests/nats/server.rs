//! NATS servers of a test's own ([`NatsServer`]), from the machine's
//! `nats-server` binary: one with a user and password, and one in
//! operator mode ([`SecuredServer`]), which takes only users whose JWT its
//! account signed, so a connection succeeds only with the user's
//! credentials file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use nkeys::KeyPair;
use serde_json::{json, Value};

/// A `nats-server` of a test's own, with JetStream, listening on a free
/// port of 127.0.0.1, its files (JetStream's store, its log) in a
/// temporary directory; killed (by pid) when dropped.
pub struct NatsServer {
    child: Child,
    /// Its port.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts `nats-server` with `args` added, and waits until it listens
    /// (a server that does not is a failed test, showing its log).
    pub fn start(args: &[&OsStr]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.path().join("server.log");
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("js"))
            .arg("-l")
            .arg(&log)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed (the NATS of the machine runs it)");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        server.wait_listening(&log);
        server
    }

    /// `nats://{credentials}127.0.0.1:PORT`.
    pub fn url(&self, credentials: &str) -> String {
        format!("nats://{credentials}127.0.0.1:{}", self.port)
    }

    fn wait_listening(&self, log: &Path) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                panic!("nats-server did not listen; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server in operator mode, with a user's credentials file.
pub struct SecuredServer {
    /// The running server.
    pub server: NatsServer,
    /// `nats://127.0.0.1:PORT`, without credentials.
    pub url: String,
    /// The user's `.creds` file: its JWT and its seed.
    pub creds: PathBuf,
    _dir: tempfile::TempDir,
}

impl SecuredServer {
    /// Writes the operator, account and user JWTs and the server's
    /// configuration, then starts the server.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();
        let operator_jwt = jwt(
            &operator,
            &operator,
            "operator",
            json!({"system_account": system.public_key()}),
        );
        let system_jwt = jwt(&operator, &system, "account", json!({}));
        let account_jwt = jwt(&operator, &account, "account", account_claims());
        let user_jwt = jwt(&account, &user, "user", user_claims());
        let creds = dir.path().join("user.creds");
        std::fs::write(&creds, creds_file(&user_jwt, &user.seed().unwrap())).unwrap();
        let conf = dir.path().join("server.conf");
        let accounts = [(&system, &system_jwt), (&account, &account_jwt)];
        std::fs::write(&conf, server_conf(&operator_jwt, accounts)).unwrap();
        let server = NatsServer::start(&[OsStr::new("-c"), conf.as_os_str()]);
        Self {
            url: server.url(""),
            server,
            creds,
            _dir: dir,
        }
    }
}

/// A JWT of `kind` for `subject`, signed by `issuer` (ed25519 over the
/// header and the claims, as NATS JWTs are).
fn jwt(issuer: &KeyPair, subject: &KeyPair, kind: &str, nats: Value) -> String {
    let mut nats = nats;
    nats["type"] = json!(kind);
    nats["version"] = json!(2);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "jti": format!("{kind}{}", now),
        "iat": now,
        "iss": issuer.public_key(),
        "name": kind,
        "sub": subject.public_key(),
        "nats": nats,
    });
    let header = json!({"typ": "JWT", "alg": "ed25519-nkey"});
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// An account without limits, JetStream included.
fn account_claims() -> Value {
    json!({
        "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
        },
        "default_permissions": {"pub": {}, "sub": {}}
    })
}

fn user_claims() -> Value {
    json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1})
}

fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

/// The server's configuration: its operator, and its accounts (the
/// system account first) preloaded in a memory resolver (the port and
/// JetStream's store come from the command line).
fn server_conf(operator_jwt: &str, accounts: [(&KeyPair, &String); 2]) -> String {
    let preload: String = accounts
        .iter()
        .map(|(key, jwt)| format!("  {}: {jwt}\n", key.public_key()))
        .collect();
    format!(
        "operator: {operator_jwt}\n\
         system_account: {}\n\
         resolver: MEMORY\n\
         resolver_preload: {{\n{preload}}}\n",
        accounts[0].0.public_key()
    )
}
