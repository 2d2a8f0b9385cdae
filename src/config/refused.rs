//! Megatron-LM keys that pipetrain knows and does not implement: naming one gets its reason
//! rather than "unknown key", and `false` (what every run does) is accepted and dropped.

/// (key, why it is refused).
const REFUSED: [(&str, &str); 3] =
    [("reset_position_ids", DOCUMENTS), ("reset_attention_mask", DOCUMENTS), ("eod_mask_loss", DOCUMENTS)];

const DOCUMENTS: &str = "is not supported: a window that spans a document boundary trains as one sequence \
                         (set it false or remove it)";

/// Why `key` is refused, if it is one of these.
pub fn reason(key: &str) -> Option<&'static str> {
    REFUSED.iter().find(|(k, _)| *k == key).map(|(_, why)| *why)
}
