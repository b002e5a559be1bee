//! Per-step seeds: every trainer (ELM, LoRA, GPPO, the enumeration) derives the RNG of step
//! `step` from its run seed the same way, so a resumed run draws what the uninterrupted one would.

/// Seed of step `step`'s gradient-rule RNG.
pub fn step_seed(seed: u64, step: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (step as u64)
            .wrapping_add(0xD1B5_4A32_D192_ED03)
            .rotate_left(17)
}
