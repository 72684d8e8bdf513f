//! A per-second counter for the limits a connection or a sidecar enforces (joins, events,
//! presence calls), Supabase's limits being per second too.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Rate {
    window: Instant,
    count: u32,
}

impl Default for Rate {
    fn default() -> Self {
        Rate {
            window: Instant::now(),
            count: 0,
        }
    }
}

impl Rate {
    /// Counts one event; false once more than `limit` happened within the current second.
    pub fn allow(&mut self, limit: u32) -> bool {
        if self.window.elapsed() >= Duration::from_secs(1) {
            self.window = Instant::now();
            self.count = 0;
        }
        self.count += 1;
        self.count <= limit
    }
}
