//! Log-probabilities of tokens, generated or in the prompt: a log-softmax over the model's raw
//! logits at the token's position, its rank, and the most likely alternatives there (OpenAI's
//! `logprobs`, vLLM's `prompt_logprobs`).

use sheaf_backend::generation::{TokenLogprob, TokenProb};

/// The log-probability of `token` under `logits` (a log-softmax over the whole vocabulary), its
/// rank, and the `top` most likely tokens; `piece` gives a token's bytes.
pub(crate) fn logprob(
    logits: &[f32],
    token: i32,
    top: usize,
    piece: impl Fn(i32) -> Vec<u8>,
) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let norm = max + sum.ln() as f32;
    let prob = |t: i32| TokenProb {
        token: t,
        bytes: piece(t),
        logprob: logits
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |l| l - norm),
    };
    let mut order: Vec<i32> = (0..logits.len() as i32).collect();
    let top = top.min(order.len());
    let by_logit = |a: &i32, b: &i32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if top > 0 && top < order.len() {
        order.select_nth_unstable_by(top - 1, by_logit);
    }
    order.truncate(top);
    order.sort_by(by_logit);
    let chosen = logits
        .get(token as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    TokenLogprob {
        chosen: prob(token),
        rank: 1 + logits.iter().filter(|&&l| l > chosen).count(),
        top: order.into_iter().map(prob).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_and_the_top_comes_first() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let got = logprob(&logits, 2, 2, |t| vec![b'a' + t as u8]);
        let total: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((got.chosen.logprob - (2f32.exp() / total).ln()).abs() < 1e-5);
        assert_eq!(got.chosen.bytes, b"c");
        assert_eq!(got.rank, 2, "one token is more likely");
        assert_eq!(logprob(&logits, 1, 0, |_| Vec::new()).rank, 1);
        assert_eq!(
            got.top.iter().map(|p| p.token).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert!(got.top[0].logprob <= 0.0 && got.top[0].logprob > got.top[1].logprob);
        let all = logprob(&logits, 0, 10, |_| Vec::new());
        assert_eq!(all.top.len(), 4);
        let sum: f32 = all.top.iter().map(|p| p.logprob.exp()).sum();
        assert!((sum - 1.0).abs() < 1e-5);
        assert!(logprob(&logits, 0, 0, |_| Vec::new()).top.is_empty());
    }
}
