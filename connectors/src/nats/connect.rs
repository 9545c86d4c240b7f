//! Connecting: the client, the stream and the durable pull consumer, with
//! errors that name them.

use std::fmt;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{Client, ConnectOptions};
use weir_actors::{Error, Result};

use super::options::JetStreamOptions;

/// Where a source reads: the server (its address without a password), the
/// stream and the consumer. Its `Display` is how errors name them.
#[derive(Clone, Debug)]
pub(super) struct Place {
    pub url: String,
    pub stream: String,
    pub consumer: String,
}

impl Place {
    pub fn of(options: &JetStreamOptions) -> Self {
        Self {
            url: without_password(&options.url),
            stream: options.stream.clone(),
            consumer: options.consumer.clone(),
        }
    }

    /// An error about this place: `what` failed, because of `cause`.
    pub fn error(&self, what: &str, cause: impl fmt::Display) -> Error {
        Error::msg(format!("{what} ({self}): {cause}"))
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "JetStream stream `{}`, consumer `{}` on {}",
            self.stream, self.consumer, self.url
        )
    }
}

/// `url` with the passwords of its user information left out
/// (`nats://app:secret@host` → `nats://app@host`, a token as `***`), in
/// each of its comma-separated addresses: a server URL fit for messages.
pub fn without_password(url: &str) -> String {
    url.split(',')
        .map(address_without_password)
        .collect::<Vec<_>>()
        .join(",")
}

/// One server address with the password left out.
fn address_without_password(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{user}@{host}"),
            // A user without a password is a token: a secret too.
            None => format!("***@{host}"),
        },
        None => authority.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{authority}{path}"),
        None => format!("{authority}{path}"),
    }
}

/// What a server URL logs in with: `nats://user:password@host` or
/// `nats://token@host`.
#[derive(Debug, PartialEq, Eq)]
enum Credentials {
    UserPassword(String, String),
    Token(String),
}

/// The credentials of a server URL, or of the first of a comma-separated
/// list that has some (percent-decoded), and the URL without any.
fn split_credentials(urls: &str) -> (Option<Credentials>, String) {
    let mut credentials = None;
    let mut addresses = Vec::new();
    for url in urls.split(',') {
        let (found, address) = split_one(url.trim());
        credentials = credentials.or(found);
        addresses.push(address);
    }
    (credentials, addresses.join(","))
}

/// The credentials of one server URL, and the URL without them. A URL
/// that does not parse (`host:4222`, without a scheme) has none.
fn split_one(address: &str) -> (Option<Credentials>, String) {
    let Ok(mut url) = url::Url::parse(address) else {
        return (None, address.to_string());
    };
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8_lossy()
            .into_owned()
    };
    let credentials = match (url.username(), url.password()) {
        ("", None) => return (None, address.to_string()),
        (user, Some(password)) => Credentials::UserPassword(decode(user), decode(password)),
        (token, None) => Credentials::Token(decode(token)),
    };
    // Clearing the user information of a URL with a host cannot fail.
    let _ = url.set_password(None);
    let _ = url.set_username("");
    (Some(credentials), url.to_string())
}

/// A client connected to the server, logged in with the URL's user and
/// password or the credentials file.
pub(super) async fn client(options: &JetStreamOptions, place: &Place) -> Result<Client> {
    let connect = match &options.creds_file {
        Some(path) => ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| {
                Error::msg(format!(
                    "cannot read the NATS credentials file {}: {e}",
                    path.display()
                ))
            })?,
        None => ConnectOptions::new(),
    };
    let (credentials, address) = split_credentials(&options.url);
    let connect = match credentials {
        Some(Credentials::UserPassword(user, password)) => {
            connect.user_and_password(user, password)
        }
        Some(Credentials::Token(token)) => connect.token(token),
        None => connect,
    };
    connect
        .name("weir")
        .connect(address.as_str())
        .await
        .map_err(|e| Error::msg(format!("cannot connect to NATS at {}: {e}", place.url)))
}

/// The stream, which must exist.
pub(super) async fn stream(context: &jetstream::Context, place: &Place) -> Result<Stream> {
    match context.get_stream(&place.stream).await {
        Ok(stream) => Ok(stream),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                Err(Error::msg(format!(
                    "JetStream stream `{}` does not exist on {}",
                    place.stream, place.url
                )))
            }
            _ => Err(Error::msg(format!(
                "cannot read JetStream stream `{}` on {}: {e}",
                place.stream, place.url
            ))),
        },
    }
}

/// The most messages a consumer weir creates leaves unacknowledged: above
/// twice the default `ConsumeOptions::max_in_flight` (a batch running and
/// the next read ahead), so that the batch size, not the server, bounds a
/// fetch.
pub const MAX_ACK_PENDING: i64 = 20_000;

/// The durable pull consumer: reused if it exists, created otherwise
/// (explicit acknowledgements, from the stream's first message). A
/// consumer that does not acknowledge each message explicitly is refused.
pub(super) async fn consumer(stream: &Stream, place: &Place) -> Result<PullConsumer> {
    let config = pull::Config {
        durable_name: Some(place.consumer.clone()),
        ack_policy: AckPolicy::Explicit,
        deliver_policy: DeliverPolicy::All,
        description: Some("weir".to_string()),
        max_ack_pending: MAX_ACK_PENDING,
        ..Default::default()
    };
    let consumer = stream
        .get_or_create_consumer(&place.consumer, config)
        .await
        .map_err(|e| place.error("cannot create or read the durable pull consumer", e))?;
    let policy = consumer.cached_info().config.ack_policy;
    if policy != AckPolicy::Explicit {
        return Err(place.error(
            "the consumer cannot be used",
            format!("it acknowledges with policy {policy:?}; weir needs explicit acknowledgements"),
        ));
    }
    Ok(consumer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_left_out_of_the_url() {
        assert_eq!(
            without_password("nats://app:secret@127.0.0.1:4222"),
            "nats://app@127.0.0.1:4222"
        );
        assert_eq!(
            without_password("nats://token@host:4222/x"),
            "nats://***@host:4222/x"
        );
        assert_eq!(without_password("nats://host:4222"), "nats://host:4222");
        assert_eq!(without_password("host:4222"), "host:4222");
        assert_eq!(
            without_password("nats://a:b@h1:4222,nats://c:d@h2:4222"),
            "nats://a@h1:4222,nats://c@h2:4222"
        );
    }

    #[test]
    fn credentials_are_taken_out_of_the_url_and_decoded() {
        assert_eq!(
            split_credentials("nats://app:p%40ss@127.0.0.1:4222"),
            (
                Some(Credentials::UserPassword("app".into(), "p@ss".into())),
                "nats://127.0.0.1:4222".to_string()
            )
        );
        assert_eq!(
            split_credentials("nats://tok@h1:4222, nats://h2:4222"),
            (
                Some(Credentials::Token("tok".into())),
                "nats://h1:4222,nats://h2:4222".to_string()
            )
        );
        assert_eq!(
            split_credentials("nats://h:4222"),
            (None, "nats://h:4222".to_string())
        );
    }
}
