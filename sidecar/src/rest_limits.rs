//! The REST broadcast routes' bounds. The anon key is public and every visitor of an app
//! shares it, so nothing here counts by token: requests in flight are bounded in total and
//! per client address (before the body is read), messages per request, and messages per
//! second per address, per wider block of addresses (an IPv6 /56 and /48, an IPv4 /24), per
//! user (the JWT's `sub`) and in total (Supabase answers 429 against
//! its tenant's events per second, with the same texts). A `service_role` token is a
//! backend's: it skips the per-address and per-user bounds (one server sends for many users
//! from one address) and is still counted in the totals.
//!
//! REST also may hold at most half of the relay's queue: WebSocket pushes, which are
//! refused rather than kept waiting when the queue is full, always find the other half.

use crate::address::{AddressKey, Block};
use crate::config::Config;
use crate::tally::{Entered, InFlight, Over, RateTally};
use hyper::StatusCode;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Supabase's texts (its rate limiter plug and `BatchBroadcast`).
pub const TOO_MANY_REQUESTS: &str = "Too many requests";
pub const RATE_EXCEEDED: &str = "You have exceeded your rate limit";
pub const BATCH_TOO_LARGE: &str = "Too many messages to broadcast, please reduce the batch size";
pub const RELAY_BUSY: &str =
    "UnableToBroadcast: too many broadcasts are waiting for the database; retry";

/// Who sends, as the limits see it.
pub struct Sender<'a> {
    pub address: AddressKey,
    pub sub: Option<&'a str>,
    /// A `service_role` token: the per-address and per-user bounds do not apply.
    pub backend: bool,
}

/// What a REST route answers: its status and JSON body.
pub type Outcome = (StatusCode, Option<serde_json::Value>);

/// Why a request was refused: the status and `{"message": ...}` body it is answered with.
#[derive(Debug, PartialEq)]
pub struct Refused {
    pub status: StatusCode,
    pub message: String,
}

impl Refused {
    fn too_many(message: impl Into<String>) -> Refused {
        Refused {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
        }
    }

    pub fn outcome(&self) -> Outcome {
        (self.status, Some(json!({ "message": self.message })))
    }
}

pub struct RestLimits {
    in_flight: Arc<AtomicUsize>,
    per_address: InFlight<AddressKey>,
    total_rate: RateTally<()>,
    address_rate: RateTally<AddressKey>,
    block_rate: RateTally<Block>,
    /// MAX_REST_EVENTS_PER_SECOND_PER_IPV6_56, _48, _IPV4_24, by prefix length.
    per_block: [(u8, u32); 3],
    user_rate: RateTally<String>,
    relay_share: Arc<Semaphore>,
    max_in_flight: usize,
    max_in_flight_per_address: usize,
    max_messages: usize,
    max_total: u32,
    /// Of `max_total`, what clients other than backends may use (BACKEND_RESERVE_PERCENT).
    clients_total: u32,
    max_per_address: u32,
    max_per_user: u32,
}

/// A request being served; dropping it ends its place.
pub struct Admitted {
    _address: Option<Entered<AddressKey>>,
    total: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.total.fetch_sub(1, Relaxed);
    }
}

impl RestLimits {
    /// `relay_capacity`: the relay queue's length, of which REST may hold half; `in_flight`:
    /// where the requests being served are counted (the metrics' gauge reads it).
    pub fn new(cfg: &Config, relay_capacity: usize, in_flight: Arc<AtomicUsize>) -> Self {
        let sweep_at = cfg.max_rest_events_per_second as usize;
        RestLimits {
            in_flight,
            per_address: InFlight::default(),
            total_rate: RateTally::new(1),
            address_rate: RateTally::new(sweep_at),
            block_rate: RateTally::new(sweep_at),
            per_block: [
                (56, cfg.max_rest_events_per_second_per_ipv6_56),
                (48, cfg.max_rest_events_per_second_per_ipv6_48),
                (24, cfg.max_rest_events_per_second_per_ipv4_24),
            ],
            user_rate: RateTally::new(sweep_at),
            relay_share: Arc::new(Semaphore::new((relay_capacity / 2).max(1))),
            max_in_flight: cfg.max_rest_requests_in_flight,
            max_in_flight_per_address: cfg.max_rest_requests_in_flight_per_address,
            max_messages: cfg.max_rest_messages_per_request,
            max_total: cfg.max_rest_events_per_second,
            clients_total: cfg.clients_share(cfg.max_rest_events_per_second as u64) as u32,
            max_per_address: cfg.max_rest_events_per_second_per_address,
            max_per_user: cfg.max_rest_events_per_second_per_user,
        }
    }

    /// A place for one request, taken before its body is read (a body may be a megabyte).
    /// An address that spent its second's messages is refused here, before its body is read:
    /// reading and parsing a megabyte it would then refuse was the flood's whole cost.
    pub fn admit(&self, who: &Sender) -> Result<Admitted, Refused> {
        if !who.backend
            && self
                .address_rate
                .check(&who.address, 1, self.max_per_address)
                == Err(Over::Rate)
        {
            return Err(Refused::too_many(RATE_EXCEEDED));
        }
        let address = match who.backend {
            true => None,
            false => Some(
                self.per_address
                    .enter(who.address, self.max_in_flight_per_address)
                    .ok_or_else(|| Refused::too_many(TOO_MANY_REQUESTS))?,
            ),
        };
        if self.in_flight.fetch_add(1, Relaxed) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Relaxed);
            return Err(Refused::too_many(TOO_MANY_REQUESTS));
        }
        Ok(Admitted {
            _address: address,
            total: self.in_flight.clone(),
        })
    }

    /// MAX_REST_MESSAGES_PER_REQUEST: a batch's messages built at most (`rest_body`).
    pub fn max_messages(&self) -> usize {
        self.max_messages
    }

    /// Counts a request's `n` messages against every rate that applies, or refuses them all.
    /// A batch over the per-request bound, or too large for what its address has left, still
    /// spends the address's second (the body was read and parsed): its next requests are
    /// refused before their bodies are read. Nothing else is counted for a refused batch.
    pub fn charge(&self, who: &Sender, n: usize) -> Result<(), Refused> {
        let spend_address = |n: usize| {
            if !who.backend {
                let n = n.min(self.max_per_address as usize) as u32;
                self.address_rate.charge(&who.address, n);
            }
        };
        if n > self.max_messages {
            spend_address(n);
            return Err(Refused::too_many(BATCH_TOO_LARGE));
        }
        let n = n as u32;
        let answer = |over: Over| {
            Refused::too_many(match over {
                Over::Rate => RATE_EXCEEDED,
                Over::Batch => BATCH_TOO_LARGE,
            })
        };
        if !who.backend {
            if let Err(over) = self
                .address_rate
                .check(&who.address, n, self.max_per_address)
            {
                spend_address(n as usize);
                return Err(answer(over));
            }
            for block in who.address.blocks() {
                self.block_rate
                    .check(&block, n, self.of_block(&block))
                    .map_err(answer)?;
            }
            if let Some(sub) = who.sub {
                self.user_rate
                    .check(&sub.to_owned(), n, self.max_per_user)
                    .map_err(answer)?;
            }
        }
        // A backend may use the whole total; clients leave its reserve to backends, so
        // clients that fill their part never lock the app's server out (issue 39, M2).
        let total = if who.backend {
            self.max_total
        } else {
            self.clients_total
        };
        self.total_rate.check(&(), n, total).map_err(answer)?;
        self.total_rate.charge(&(), n);
        if !who.backend {
            self.address_rate.charge(&who.address, n);
            for block in who.address.blocks() {
                self.block_rate.charge(&block, n);
            }
            if let Some(sub) = who.sub {
                self.user_rate.charge(&sub.to_owned(), n);
            }
        }
        Ok(())
    }

    /// Room in REST's half of the relay for `n` messages, held until they are settled; waits
    /// at most `patience` for other requests' messages to settle.
    pub async fn relay_room(
        &self,
        n: usize,
        patience: std::time::Duration,
    ) -> Result<OwnedSemaphorePermit, Refused> {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let wait = self.relay_share.clone().acquire_many_owned(n);
        match tokio::time::timeout(patience, wait).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Refused {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: RELAY_BUSY.into(),
            }),
        }
    }

    fn of_block(&self, block: &Block) -> u32 {
        self.per_block
            .iter()
            .find(|(prefix, _)| *prefix == block.prefix)
            .map_or(u32::MAX, |&(_, limit)| limit)
    }

    pub fn in_flight_from(&self, address: &AddressKey) -> usize {
        self.per_address.count(address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn limits(args: &[&str]) -> RestLimits {
        let mut all = vec![
            "realtime-sidecar",
            "--jwt-secret",
            "a-secret-of-at-least-thirty-two-bytes",
        ];
        all.extend_from_slice(args);
        RestLimits::new(&Config::try_parse_from(all).unwrap(), 8, Arc::default())
    }

    fn from(ip: &str, sub: Option<&'static str>) -> Sender<'static> {
        Sender {
            address: AddressKey::of(ip.parse().unwrap()),
            sub,
            backend: false,
        }
    }

    #[test]
    fn requests_in_flight_are_bounded_per_address_and_in_total() {
        let l = limits(&[
            "--max-rest-requests-in-flight",
            "3",
            "--max-rest-requests-in-flight-per-address",
            "2",
        ]);
        let a = from("192.0.2.1", None);
        let (a1, _a2) = (l.admit(&a).unwrap(), l.admit(&a).unwrap());
        assert_eq!(l.admit(&a).err().unwrap().message, TOO_MANY_REQUESTS);
        let _b = l.admit(&from("192.0.2.2", None)).unwrap();
        // Three in flight: nobody else, whatever the address.
        assert!(l.admit(&from("192.0.2.3", None)).is_err());
        drop(a1);
        assert_eq!(l.in_flight_from(&a.address), 1);
        assert!(l.admit(&from("192.0.2.3", None)).is_ok());
    }

    #[test]
    fn rates_count_by_address_and_by_user_never_by_token() {
        let l = limits(&[
            "--max-rest-events-per-second-per-address",
            "10",
            "--max-rest-events-per-second-per-user",
            "5",
            "--max-rest-messages-per-request",
            "20",
        ]);
        // Two anonymous visitors share the anon key, not a budget.
        l.charge(&from("192.0.2.1", None), 10).unwrap();
        let refused = l.charge(&from("192.0.2.1", None), 1).unwrap_err();
        assert_eq!(
            (refused.status, refused.message.as_str()),
            (StatusCode::TOO_MANY_REQUESTS, RATE_EXCEEDED)
        );
        l.charge(&from("192.0.2.2", None), 10).unwrap();
        // One user from two addresses spends one budget.
        l.charge(&from("192.0.2.3", Some("u1")), 3).unwrap();
        let refused = l.charge(&from("192.0.2.4", Some("u1")), 3).unwrap_err();
        assert_eq!(refused.message, BATCH_TOO_LARGE);
        // A refused batch counted nothing: the address still has its ten.
        l.charge(&from("192.0.2.4", Some("u2")), 5).unwrap();
        // A batch over the per-request bound is refused whatever the budgets, and spends its
        // address's second: the next request is refused before its body is read.
        let refused = l.charge(&from("192.0.2.5", None), 21).unwrap_err();
        assert_eq!(refused.message, BATCH_TOO_LARGE);
        let refused = l.admit(&from("192.0.2.5", None)).err().unwrap();
        assert_eq!(refused.message, RATE_EXCEEDED);
        assert!(l.admit(&from("192.0.2.6", None)).is_ok());
    }

    /// Issue 39, M2: REST rates were counted per /64 and in total only, so one client with
    /// the /64s of a /56 (a residential line) had 256 addresses' rates and could take the
    /// whole total. Each wider block has a rate of its own now.
    #[test]
    fn the_64s_of_one_56_each_had_an_address_s_rest_rate() {
        let l = limits(&[
            "--max-rest-events-per-second-per-address",
            "10",
            "--max-rest-events-per-second-per-ipv6-56",
            "25",
            "--max-rest-messages-per-request",
            "100",
        ]);
        l.charge(&from("2001:db8:0:1::1", None), 10).unwrap();
        l.charge(&from("2001:db8:0:2::1", None), 10).unwrap();
        let refused = l.charge(&from("2001:db8:0:3::1", None), 10).unwrap_err();
        assert_eq!(refused.message, BATCH_TOO_LARGE, "5 left in the /56");
        l.charge(&from("2001:db8:0:3::1", None), 5).unwrap();
        let refused = l.charge(&from("2001:db8:0:4::1", None), 1).unwrap_err();
        assert_eq!(refused.message, RATE_EXCEEDED);
        // Another /56 of the same /48 has its own.
        l.charge(&from("2001:db8:0:100::1", None), 10).unwrap();
        // IPv4: a /24's addresses share 4000 by default; here the address bound comes first.
        l.charge(&from("192.0.2.1", None), 10).unwrap();
        l.charge(&from("192.0.2.2", None), 10).unwrap();
    }

    #[test]
    fn a_backend_skips_the_address_and_user_bounds_but_not_the_total() {
        let l = limits(&[
            "--max-rest-events-per-second-per-address",
            "1",
            "--max-rest-events-per-second",
            "50",
            "--max-rest-requests-in-flight-per-address",
            "1",
        ]);
        let backend = Sender {
            backend: true,
            ..from("192.0.2.9", Some("svc"))
        };
        let _held = [l.admit(&backend).unwrap(), l.admit(&backend).unwrap()];
        l.charge(&backend, 40).unwrap();
        assert_eq!(l.charge(&backend, 20).unwrap_err().message, BATCH_TOO_LARGE);
    }

    #[tokio::test]
    async fn rest_holds_at_most_half_of_the_relay() {
        let l = limits(&[]);
        let patience = std::time::Duration::from_millis(50);
        let held = l.relay_room(4, patience).await.unwrap();
        let refused = l.relay_room(1, patience).await.unwrap_err();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        drop(held);
        assert!(l.relay_room(4, patience).await.is_ok());
    }
}
