//! SipHash-2-4 (Aumasson and Bernstein), the keyed hash `rate-limit` homes its keys with:
//! without the key, nobody can choose client keys that land on a victim's slots.

/// The 128-bit key: chosen at random once per Envoy process and shared by its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u64; 2]);

impl Secret {
    /// From 32 hexadecimal digits (as stored in shared data).
    pub fn from_hex(text: &str) -> Option<Self> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let k0 = u64::from_str_radix(text.get(..16)?, 16).ok()?;
        let k1 = u64::from_str_radix(text.get(16..)?, 16).ok()?;
        Some(Self([k0, k1]))
    }

    pub fn to_hex(self) -> String {
        format!("{:016x}{:016x}", self.0[0], self.0[1])
    }

    /// A new random secret, from the OS's (or WASI's) random source through std's
    /// `RandomState`, whose SipHash keys are random: its outputs are unpredictable.
    pub fn random() -> Self {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        Self([state.hash_one(0x5eed_u64), state.hash_one(0xfeed_u64)])
    }
}

#[inline]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-2-4 of `data` under `secret`.
pub fn siphash(secret: Secret, data: &[u8]) -> u64 {
    let [k0, k1] = secret.0;
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let m = u64::from_le_bytes(word);
        v[3] ^= m;
        round(&mut v);
        round(&mut v);
        v[0] ^= m;
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    last[7] = data.len() as u8;
    let m = u64::from_le_bytes(last);
    v[3] ^= m;
    round(&mut v);
    round(&mut v);
    v[0] ^= m;
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference vectors of the SipHash paper: key 00..0f, messages 00, 00 01, ...
    #[test]
    fn matches_the_reference_vectors() {
        let key = Secret([0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908]);
        let data: Vec<u8> = (0..64).collect();
        assert_eq!(siphash(key, &data[..0]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash(key, &data[..1]), 0x74f8_39c5_93dc_67fd);
        assert_eq!(siphash(key, &data[..8]), 0x93f5_f579_9a93_2462);
        assert_eq!(siphash(key, &data[..15]), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn secrets_round_trip_as_hex_and_differ() {
        let s = Secret::random();
        assert_eq!(Secret::from_hex(&s.to_hex()), Some(s));
        assert_ne!(Secret::random(), s);
        assert_eq!(Secret::from_hex("xyz"), None);
    }
}
