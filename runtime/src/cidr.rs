//! IP address blocks (`10.0.0.0/24`, `fd00::/64`, or a bare address meaning just it), for the
//! addresses a server treats as the apiserver's. Small and pure: parsing and membership only.

use std::{fmt, net::IpAddr, str::FromStr};

/// An address block: every address whose first `prefix` bits are `network`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the block. An IPv4 address written as IPv6 (`::ffff:10.0.0.1`, what a
    /// dual-stack listener reports) is compared as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(u32::from(net)), 32, self.prefix)
                    == masked(u128::from(u32::from(ip)), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), 128, self.prefix) == masked(u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// The first `prefix` of `bits` bits of `value`.
fn masked(value: u128, bits: u8, prefix: u8) -> u128 {
    if prefix == 0 { 0 } else { value >> (bits - prefix) }
}

/// Whether any of `blocks` contains `ip`.
pub fn any_contains(blocks: &[Cidr], ip: IpAddr) -> bool {
    blocks.iter().any(|b| b.contains(ip))
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (address, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR block"))?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {bits}"))?,
        };
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_contain_their_addresses_only() {
        for (block, inside, outside) in [
            ("10.0.0.0/24", "10.0.0.255", "10.0.1.0"),
            ("10.0.0.7", "10.0.0.7", "10.0.0.8"),
            ("10.0.0.7/32", "10.0.0.7", "10.0.0.6"),
            ("0.0.0.0/0", "203.0.113.9", "::1"),
            ("198.18.0.1/32", "::ffff:198.18.0.1", "198.18.0.2"),
            ("fd00::/64", "fd00::1:2", "fd00:0:0:1::"),
            ("::1", "::1", "127.0.0.1"),
            ("::/0", "2001:db8::1", "10.0.0.1"),
        ] {
            let cidr: Cidr = block.parse().unwrap();
            assert!(cidr.contains(ip(inside)), "{block} contains {inside}");
            assert!(!cidr.contains(ip(outside)), "{block} does not contain {outside}");
        }
    }

    #[test]
    fn bad_blocks_are_refused_with_the_text() {
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0/24",
            "fd00::/129",
            "host.example",
            "10.0.0.0/-1",
        ] {
            let err = bad.parse::<Cidr>().expect_err(bad);
            assert!(err.contains(bad.trim()), "{err}");
        }
        assert_eq!("10.1.0.0/16".parse::<Cidr>().unwrap().to_string(), "10.1.0.0/16");
        assert_eq!("10.1.0.3".parse::<Cidr>().unwrap().to_string(), "10.1.0.3/32");
    }
}
