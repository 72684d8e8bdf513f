//! Configuration settings (GUCs) of the extension.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Ring size in kB. 256 MB holds about 4.5 s of 100k msg/s with 512-byte payloads.
static QUEUE_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(256 * 1024);
/// Largest message (topic + event + payload) in kB: Supabase's max_payload_size_in_kb, 3000,
/// in this setting's unit (1,024 bytes), so 3,072,000 bytes. The sidecar reads client frames
/// of up to 5 MB (MAX_FRAME_SIZE) within its byte budgets.
static MAX_MESSAGE_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(3000);
static MAX_CONSUMERS: GucSetting<i32> = GucSetting::<i32>::new(8);
/// Topics and tables one consumer may listen to (`interest.rs`); each costs 32 bytes of
/// shared memory per consumer slot, whether used or not.
static MAX_TOPICS_PER_CONSUMER: GucSetting<i32> = GucSetting::<i32>::new(16384);
/// Decoded change data one drain call returns at most, in kB (and one change more).
static DRAIN_MAX_DECODED_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);
/// A decoded change past this many bytes keeps only its small values (Supabase's
/// max_record_bytes, 1 MiB), set by the sidecar from its MAX_RECORD_BYTES.
static MAX_RECORD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
/// A message that cannot be sent is an ERROR rather than Supabase's WARNING (`dropped.rs`).
static STRICT_SEND: GucSetting<bool> = GucSetting::<bool>::new(false);

pub fn init() {
    GucRegistry::define_int_guc(
        c"realtime.queue_size",
        c"Size of the shared-memory message queue.",
        c"Messages committed while consumers are behind are kept here; when it is full the oldest are dropped and reported to consumers as a gap.",
        &QUEUE_SIZE_KB,
        64,
        i32::MAX,
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"realtime.max_message_size",
        c"Largest message (topic, event and payload) that realtime.send and friends accept.",
        c"",
        &MAX_MESSAGE_SIZE_KB,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"realtime.drain_max_decoded_size",
        c"Decoded change data one drain call returns at most (and one change more).",
        c"A drain reads a batch by the queue's bytes, and a change's row can decode to far more than it takes there (a value that compresses well, re-captured by every UPDATE): past this the call stops after the change that passed it, and the next call goes on from there.",
        &DRAIN_MAX_DECODED_KB,
        64,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"realtime.max_record_bytes",
        c"Decoded size past which a change keeps only its values of at most 64 bytes, and says Error 413.",
        c"Supabase's max_record_bytes, applied where a change is decoded (a drain, realtime.history) rather than after: a row that decodes to megabytes is never held whole past its own decoding. Each session may set its own; the sidecar sets its MAX_RECORD_BYTES.",
        &MAX_RECORD_BYTES,
        64,
        i32::MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"realtime.strict_send",
        c"Makes a message that cannot be sent an ERROR instead of a WARNING.",
        c"By default, as on Supabase, realtime.send and the other producers of the app warn and drop a message that cannot be sent (a bad topic, event or payload, too large, a transaction larger than the queue) and the transaction goes on; the topic's subscribers are told. On, each is an ERROR that aborts the transaction. Any role may set it: it decides only the fate of its own transactions.",
        &STRICT_SEND,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"realtime.max_consumers",
        c"Number of named consumer slots (one per sidecar).",
        c"",
        &MAX_CONSUMERS,
        1,
        1024,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"realtime.max_topics_per_consumer",
        c"Number of topics and tables one consumer may listen to with realtime.listen.",
        c"A consumer that would listen to more is refused; it can receive everything instead (realtime.listen_all).",
        &MAX_TOPICS_PER_CONSUMER,
        16,
        1 << 24,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

pub fn drain_max_decoded_bytes() -> usize {
    DRAIN_MAX_DECODED_KB.get() as usize * 1024
}

pub fn strict_send() -> bool {
    STRICT_SEND.get()
}

pub fn max_record_bytes() -> usize {
    MAX_RECORD_BYTES.get() as usize
}

pub fn queue_size_bytes() -> u64 {
    QUEUE_SIZE_KB.get() as u64 * 1024
}

pub fn max_message_size_bytes() -> usize {
    MAX_MESSAGE_SIZE_KB.get() as usize * 1024
}

pub fn max_consumers() -> u32 {
    MAX_CONSUMERS.get() as u32
}

pub fn max_topics_per_consumer() -> u32 {
    MAX_TOPICS_PER_CONSUMER.get() as u32
}
