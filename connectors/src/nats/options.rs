//! [`JetStreamOptions`]: where the stream is and how it is read.

use std::path::PathBuf;
use std::time::Duration;

/// The default name of the durable consumer.
pub const DEFAULT_CONSUMER: &str = "weir";
/// The default header that marks a tombstone.
pub const DEFAULT_DELETE_HEADER: &str = "Weir-Delete";
/// The default of [`JetStreamOptions::fetch_wait`].
pub const DEFAULT_FETCH_WAIT: Duration = Duration::from_secs(1);

/// How a [`JetStreamSource`](super::JetStreamSource) connects and reads:
/// a builder.
///
/// ```
/// use std::time::Duration;
/// use weir_connectors::nats::JetStreamOptions;
///
/// let options = JetStreamOptions::new("nats://app:secret@127.0.0.1:4222", "orders")
///     .consumer("orders-to-postgres")
///     .dead_letter_subject("orders.dead")
///     .follow(true)
///     .fetch_wait(Duration::from_millis(500));
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct JetStreamOptions {
    pub(super) url: String,
    pub(super) stream: String,
    pub(super) consumer: String,
    pub(super) key_header: Option<String>,
    pub(super) delete_header: String,
    pub(super) creds_file: Option<PathBuf>,
    pub(super) follow: bool,
    pub(super) dead_letter_subject: Option<String>,
    pub(super) fetch_wait: Duration,
}

impl JetStreamOptions {
    /// Reads the stream `stream` of the server at `url`
    /// (`nats://host:4222`, or `nats://user:password@host:4222` to log in
    /// with a user and password).
    pub fn new(url: impl Into<String>, stream: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            stream: stream.into(),
            consumer: DEFAULT_CONSUMER.to_string(),
            key_header: None,
            delete_header: DEFAULT_DELETE_HEADER.to_string(),
            creds_file: None,
            follow: false,
            dead_letter_subject: None,
            fetch_wait: DEFAULT_FETCH_WAIT,
        }
    }

    /// The name of the durable pull consumer (created if missing, reused
    /// otherwise); [`DEFAULT_CONSUMER`] unless set. A consumer holds the
    /// position of one reader: another name reads the stream from its
    /// start. In a worker group, every member gives the same name and
    /// reads through the consumers `{name}-pN` of the partitions it holds
    /// (see the [module](super#worker-groups)).
    #[must_use]
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = name.into();
        self
    }

    /// Takes an item's key from this header instead of the last token of
    /// the message's subject.
    #[must_use]
    pub fn key_header(mut self, header: impl Into<String>) -> Self {
        self.key_header = Some(header.into());
        self
    }

    /// The header whose presence makes a message a tombstone;
    /// [`DEFAULT_DELETE_HEADER`] unless set. A message with an empty
    /// payload is a tombstone too.
    #[must_use]
    pub fn delete_header(mut self, header: impl Into<String>) -> Self {
        self.delete_header = header.into();
        self
    }

    /// Logs in with this credentials file (a user JWT and its NKey seed).
    #[must_use]
    pub fn creds_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.creds_file = Some(path.into());
        self
    }

    /// `false` (the default): read up to the stream's last message at
    /// connect time, then end. `true`: keep reading new messages until the
    /// app shuts down.
    #[must_use]
    pub fn follow(mut self, live: bool) -> Self {
        self.follow = live;
        self
    }

    /// Publishes each released message (after its last allowed delivery)
    /// to this subject too, with headers naming the failure
    /// (`Weir-Failure`), its subject (`Weir-Subject`) and its stream
    /// sequence (`Weir-Sequence`).
    #[must_use]
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    /// How long one pull request waits for messages when none is ready
    /// (in follow mode, and in bounded mode while redeliveries are due);
    /// [`DEFAULT_FETCH_WAIT`] unless set. A message arriving meanwhile is
    /// returned at once.
    #[must_use]
    pub fn fetch_wait(mut self, d: Duration) -> Self {
        self.fetch_wait = d.max(Duration::from_millis(10));
        self
    }
}
