//! Random perfect tilings: `extent` split into `parts` factors whose product is `extent`.

use crate::rng::Rng;

/// Prime factors of `n` with multiplicity, ascending.
pub fn prime_factors(mut n: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n % p == 0 {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// Draws a perfect tiling of `extent` into `parts` factors (outermost first) whose innermost
/// factor is at most `max_innermost`, each prime factor going to a uniformly chosen part.
pub fn sample_perfect_tile(
    rng: &mut Rng,
    extent: i64,
    parts: usize,
    max_innermost: i64,
) -> Vec<i64> {
    let primes = prime_factors(extent.max(1));
    for _ in 0..64 {
        let mut factors = vec![1i64; parts];
        for p in &primes {
            factors[rng.below(parts)] *= p;
        }
        if factors[parts - 1] <= max_innermost {
            return factors;
        }
    }
    // Every prime outside the innermost part is always a valid tiling.
    let mut factors = vec![1i64; parts];
    factors[0] = extent.max(1);
    factors
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tiles_are_perfect(extent in 1i64..5000, parts in 1usize..5, seed in any::<u64>()) {
            let mut rng = crate::rng::Rng::new(seed);
            let f = sample_perfect_tile(&mut rng, extent, parts, 64);
            prop_assert_eq!(f.len(), parts);
            prop_assert_eq!(f.iter().product::<i64>(), extent);
            prop_assert!(f[parts - 1] <= 64 || parts == 1 && extent > 64 && f[0] == extent);
        }
    }

    #[test]
    fn factors_multiply_back() {
        for n in 1..500 {
            assert_eq!(prime_factors(n).iter().product::<i64>(), n.max(1));
        }
    }
}
