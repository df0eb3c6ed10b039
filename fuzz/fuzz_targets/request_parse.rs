//! Arbitrary bytes as the body of every kiln-server endpoint's parser:
//! never a panic, and an accepted request respects the limits it was
//! parsed under (choices, token limit, logprobs, stop strings, token ids).
#![no_main]

use kiln_server::request::{
    parse_chat, parse_completion, parse_detokenize, parse_embeddings, parse_tokenize, Limits,
    PromptInput,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        n_vocab: 1000,
        max_context: 512,
        ..Limits::default()
    };
    for parse in [parse_completion, parse_chat] {
        let Ok(r) = parse(data, &limits) else {
            continue;
        };
        assert!((1..=limits.max_n).contains(&r.n));
        assert!(r.max_tokens.is_none_or(|m| (1..=limits.max_context).contains(&m)));
        assert!(r.logprobs.is_none_or(|k| k <= limits.max_top_logprobs));
        assert!(r.params.stop.len() <= limits.max_stop);
        assert!(r.params.logit_bias.keys().all(|&id| (id as usize) < limits.n_vocab));
        if let PromptInput::Tokens(ids) = &r.prompt {
            assert!(ids.iter().all(|&id| (id as usize) < limits.n_vocab));
        }
        // What the parser accepts, the sampler accepts.
        r.params.validate().expect("parsed parameters validate");
    }
    if let Ok(r) = parse_embeddings(data, &limits) {
        assert!(!r.inputs.is_empty() && r.inputs.len() <= limits.max_inputs);
    }
    let _ = parse_tokenize(data);
    if let Ok(ids) = parse_detokenize(data, &limits) {
        assert!(ids.iter().all(|&id| (id as usize) < limits.n_vocab));
    }
});
