//! Who a client is on the network: the address a per-address limit counts against.
//!
//! A connection's peer is the client, unless the peer is a proxy the operator named in
//! `TRUSTED_PROXIES`; then the client is the last address of `X-Forwarded-For` that is not
//! itself a trusted proxy (each proxy appends the address it saw, so the entries left of the
//! last untrusted one are the client's own claims and are never believed). A header from a
//! peer that is not trusted is ignored: any client can write one.
//!
//! IPv6 addresses count by their /64, the block one subscriber line gets: counting single
//! addresses would let one client take a fresh address per request.

use hyper::HeaderMap;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;

/// The proxies whose `X-Forwarded-For` is believed (`TRUSTED_PROXIES`: addresses or CIDR
/// blocks, comma-separated; empty, the default: none).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses the setting; the error names the entry that is neither an address nor a block.
    pub fn parse(s: &str) -> Result<TrustedProxies, String> {
        let mut nets = Vec::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let net = IpNet::from_str(entry)
                .or_else(|_| IpAddr::from_str(entry).map(IpNet::from))
                .map_err(|_| format!("{entry:?} is not an IP address or a CIDR block"))?;
            nets.push(net);
        }
        Ok(TrustedProxies(nets))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = unmapped(ip);
        self.0.iter().any(|n| n.contains(&ip))
    }
}

/// The client's address for a request that came from `peer`.
pub fn client(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let peer = unmapped(peer);
    if !trusted.contains(peer) {
        return peer;
    }
    // Every X-Forwarded-For header, in order, is one list; read it from the right, where
    // each trusted proxy appended the address it saw, and stop at the first entry a trusted
    // proxy did not vouch for. What a client wrote further left is never read: an entry
    // there that does not parse once made the whole list count as the proxy's own.
    let hops = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect::<Vec<_>>();
    let mut entered = peer;
    for hop in hops.iter().rev() {
        match hop_address(hop) {
            Some(ip) if trusted.contains(ip) => entered = ip,
            Some(ip) => return ip,
            // A trusted proxy that could not name its peer ("unknown"): the request
            // entered there.
            None => return entered,
        }
    }
    // Every hop a trusted proxy: the first one is where the request entered.
    entered
}

/// One X-Forwarded-For entry as an address: `a.b.c.d`, `a.b.c.d:port`, an IPv6 address,
/// or `[v6]:port` (some proxies write the port).
fn hop_address(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    let bare = if let Some(rest) = hop.strip_prefix('[') {
        rest.split_once(']')?.0
    } else if hop.matches(':').count() == 1 {
        hop.split_once(':')?.0
    } else {
        hop
    };
    bare.parse::<IpAddr>().ok().map(unmapped)
}

/// What a per-address limit counts by: an IPv4 address, or an IPv6 address's /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressKey(IpAddr);

impl AddressKey {
    /// The wider blocks this address is counted in besides itself (`Block::of`).
    pub fn blocks(&self) -> Vec<Block> {
        Block::of(self.0)
    }

    pub fn of(ip: IpAddr) -> AddressKey {
        match unmapped(ip) {
            IpAddr::V6(v6) => {
                let s = v6.segments();
                AddressKey(IpAddr::V6(Ipv6Addr::new(
                    s[0], s[1], s[2], s[3], 0, 0, 0, 0,
                )))
            }
            v4 => AddressKey(v4),
        }
    }
}

impl std::fmt::Display for AddressKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V6(_) => write!(f, "{}/64", self.0),
            v4 => write!(f, "{v4}"),
        }
    }
}

/// A wider block a client's address belongs to, counted with a limit of its own: one client
/// often holds more than one /64 (a residential line gets a /56, a cloud tenant a /48: 256
/// or 65,536 /64s), and more than one IPv4 address of a /24. `AddressKey` alone let about 17
/// /64s of one /56 take every connection of the sidecar (issue 39, M2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    base: IpAddr,
    /// The prefix length: 56 or 48 for IPv6, 24 for IPv4.
    pub prefix: u8,
}

impl Block {
    /// The blocks `ip` is counted in besides its `AddressKey`: an IPv6 address's /56 and
    /// /48, an IPv4 address's /24.
    pub fn of(ip: IpAddr) -> Vec<Block> {
        match unmapped(ip) {
            IpAddr::V6(v6) => [56u8, 48]
                .into_iter()
                .map(|prefix| {
                    let bits = u128::from(v6) & (!0u128 << (128 - u32::from(prefix)));
                    Block {
                        base: IpAddr::V6(Ipv6Addr::from(bits)),
                        prefix,
                    }
                })
                .collect(),
            IpAddr::V4(v4) => {
                let bits = u32::from(v4) & (!0u32 << 8);
                vec![Block {
                    base: IpAddr::V4(std::net::Ipv4Addr::from(bits)),
                    prefix: 24,
                }]
            }
        }
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// An IPv4 client seen through an IPv6 socket (`::ffff:a.b.c.d`) is the IPv4 client.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_forwarded_for_header_from_an_untrusted_peer_is_ignored() {
        let none = TrustedProxies::default();
        let h = headers(&["203.0.113.9"]);
        assert_eq!(client(ip("198.51.100.7"), &h, &none), ip("198.51.100.7"));
    }

    #[test]
    fn behind_a_trusted_proxy_the_last_untrusted_hop_is_the_client() {
        let trusted = TrustedProxies::parse("127.0.0.1, 10.0.0.0/8").unwrap();
        // The client claims 1.1.1.1; the edge proxy saw 203.0.113.9; an inner proxy 10.1.2.3.
        let h = headers(&["1.1.1.1, 203.0.113.9", "10.1.2.3"]);
        assert_eq!(client(ip("127.0.0.1"), &h, &trusted), ip("203.0.113.9"));
        // No header: the proxy itself.
        assert_eq!(
            client(ip("127.0.0.1"), &HeaderMap::new(), &trusted),
            ip("127.0.0.1")
        );
        // A garbled list is not believed at all.
        let bad = headers(&["203.0.113.9, not-an-address"]);
        assert_eq!(client(ip("127.0.0.1"), &bad, &trusted), ip("127.0.0.1"));
        // Every hop trusted: the first.
        let inner = headers(&["10.9.9.9, 10.1.2.3"]);
        assert_eq!(client(ip("127.0.0.1"), &inner, &trusted), ip("10.9.9.9"));
        // An IPv4 peer seen through an IPv6 socket.
        assert_eq!(
            client(ip("::ffff:127.0.0.1"), &h, &trusted),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn ipv6_counts_by_its_64_block() {
        assert_eq!(
            AddressKey::of(ip("2001:db8:1:2:aaaa::1")),
            AddressKey::of(ip("2001:db8:1:2:bbbb::9"))
        );
        assert_ne!(
            AddressKey::of(ip("2001:db8:1:2::1")),
            AddressKey::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            AddressKey::of(ip("2001:db8:1:2::1")).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(AddressKey::of(ip("192.0.2.1")).to_string(), "192.0.2.1");
    }

    #[test]
    fn an_address_is_counted_in_its_56_and_48_or_its_24() {
        let of =
            |s: &str| -> Vec<String> { Block::of(ip(s)).iter().map(ToString::to_string).collect() };
        assert_eq!(
            of("2001:db8:1:2ff:aaaa::1"),
            vec!["2001:db8:1:200::/56", "2001:db8:1::/48"]
        );
        assert_eq!(
            Block::of(ip("2001:db8:1:201::1"))[0],
            Block::of(ip("2001:db8:1:2ff::1"))[0]
        );
        assert_ne!(
            Block::of(ip("2001:db8:1:301::1"))[0],
            Block::of(ip("2001:db8:1:2ff::1"))[0]
        );
        assert_eq!(of("192.0.2.77"), vec!["192.0.2.0/24"]);
        assert_eq!(of("::ffff:192.0.2.77"), vec!["192.0.2.0/24"]);
    }

    #[test]
    fn the_setting_names_what_it_cannot_read() {
        assert!(TrustedProxies::parse("").unwrap().0.is_empty());
        let err = TrustedProxies::parse("127.0.0.1, proxy.local").unwrap_err();
        assert!(err.contains("proxy.local"), "{err}");
        assert!(TrustedProxies::parse("::1, 192.168.0.0/16")
            .unwrap()
            .contains(ip("192.168.3.4")));
    }

    /// Regression (issue 39, L1): one entry a client wrote that does not parse made the
    /// whole list count as the proxy's, so a client could take a second budget (the
    /// proxy's) and fill the bucket every client with such an entry shares.
    #[test]
    fn an_unparsable_entry_a_client_wrote_does_not_make_it_the_proxy() {
        let trusted = TrustedProxies::parse("127.0.0.1").unwrap();
        let peer = ip("127.0.0.1");
        for xff in [&["x, 203.0.113.9"][..], &["unknown", "203.0.113.9"][..]] {
            assert_eq!(
                client(peer, &headers(xff), &trusted),
                ip("203.0.113.9"),
                "{xff:?}"
            );
        }
        // The proxy's own "unknown" (it could not name its peer): the request entered there.
        assert_eq!(
            client(peer, &headers(&["203.0.113.9, unknown"]), &trusted),
            peer
        );
    }

    #[test]
    fn ports_proxies_append_are_stripped() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").unwrap();
        let peer = ip("10.0.0.2");
        for (xff, want) in [
            ("198.51.100.7:51234", "198.51.100.7"),
            ("[2001:db8::7]:443", "2001:db8::7"),
            ("2001:db8::8", "2001:db8::8"),
            ("198.51.100.7:51234, 10.0.0.1:80", "198.51.100.7"),
        ] {
            assert_eq!(client(peer, &headers(&[xff]), &trusted), ip(want), "{xff}");
        }
    }
}
