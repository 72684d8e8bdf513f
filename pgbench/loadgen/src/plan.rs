//! Which topics each client joins. Deterministic, so the expected number of deliveries
//! can be counted and the same run repeated.

use crate::args::{Args, Assign};

pub fn topics_of(args: &Args, client: usize) -> Vec<usize> {
    let t = args.topics.max(1);
    match args.assign {
        Assign::RoundRobin => (0..args.channels_per_client)
            .map(|j| (client * args.channels_per_client + j) % t)
            .collect(),
        Assign::Random => {
            let mut state = args.seed ^ (client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (0..args.channels_per_client)
                .map(|_| (splitmix64(&mut state) % t as u64) as usize)
                .collect()
        }
        Assign::Group => vec![(client / args.group_size.max(1)) % t],
    }
}

/// Which of `servers` serves `topic`: FNV-1a of its name, modulo the count. Every client of
/// a topic lands on the same server, so each server's consumer listens only to its share of
/// the topics (the sidecar's `interest`).
pub fn route(topic: &str, servers: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % servers.max(1) as u64) as usize
}

/// Where in a period client `client` acts, in [0, 1): spread evenly whatever the count.
pub fn phase(client: usize) -> f64 {
    let mut state = client as u64;
    (splitmix64(&mut state) >> 11) as f64 / (1u64 << 53) as f64
}

/// A small well-known generator; the assignment only needs to be spread and repeatable.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uuid of benchmark member `u` (pgbench/joins_setup.sql makes the same ones).
pub fn member_uuid(u: u64) -> String {
    format!("{u:08x}-0000-4000-8000-{u:012x}")
}
