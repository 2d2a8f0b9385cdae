//! Every CUDA source of the backend, embedded in the binary so that a run needs no files
//! beside it, and listed so that tests can compile each one.

/// One `.cu` file: a kernel family compiled by NVRTC into one module.
pub struct KernelSource {
    /// The file name under `kernels/cuda/`.
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C"` kernels the module exports; the device loads exactly these.
    pub kernels: &'static [&'static str],
}

/// Headers the sources `#include "..."`, resolved from here rather than from a directory.
pub const HEADERS: &[(&str, &str)] = &[
    ("attention_head.cuh", include_str!("../../cuda/attention_head.cuh")),
    ("common.cuh", include_str!("../../cuda/common.cuh")),
    ("mma.cuh", include_str!("../../cuda/mma.cuh")),
    ("philox.cuh", include_str!("../../cuda/philox.cuh")),
];

pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "adamw.cu",
        source: include_str!("../../cuda/adamw.cu"),
        kernels: &["adamw", "adamw_with_bf16_copy"],
    },
    KernelSource {
        name: "attention.cu",
        source: include_str!("../../cuda/attention.cu"),
        kernels: &["split_heads", "merge_heads", "causal_softmax_forward", "causal_softmax_backward"],
    },
    KernelSource {
        name: "bias.cu",
        source: include_str!("../../cuda/bias.cu"),
        kernels: &[
            "bias_add",
            "bias_add_bf16",
            "column_partial_sums",
            "column_partial_sums_bf16",
            "add_partials",
        ],
    },
    KernelSource { name: "cast.cu", source: include_str!("../../cuda/cast.cu"), kernels: &["f32_to_bf16"] },
    KernelSource {
        name: "classifier.cu",
        source: include_str!("../../cuda/classifier.cu"),
        kernels: &["fused_classifier", "fused_classifier_bf16"],
    },
    KernelSource {
        name: "dropout.cu",
        source: include_str!("../../cuda/dropout.cu"),
        kernels: &["dropout_apply", "dropout_apply_bf16", "dropout_apply_inplace"],
    },
    KernelSource {
        name: "elementwise.cu",
        source: include_str!("../../cuda/elementwise.cu"),
        kernels: &["accumulate", "accumulate_bf16", "add", "add_bf16"],
    },
    KernelSource {
        name: "embedding.cu",
        source: include_str!("../../cuda/embedding.cu"),
        kernels: &[
            "embedding_forward",
            "embedding_forward_bf16",
            "embedding_backward_wte",
            "embedding_backward_wte_bf16",
            "embedding_backward_wpe",
            "embedding_backward_wpe_bf16",
        ],
    },
    KernelSource {
        name: "fused_attention.cu",
        source: include_str!("../../cuda/fused_attention.cu"),
        kernels: &[
            "fused_attention_forward",
            "fused_attention_backward_query",
            "fused_attention_backward_key_value",
        ],
    },
    KernelSource {
        name: "fused_attention_mma.cu",
        source: include_str!("../../cuda/fused_attention_mma.cu"),
        kernels: &[
            "fused_attention_forward_bf16",
            "fused_attention_forward_bf16_hs128",
            "fused_attention_backward_query_bf16",
            "fused_attention_backward_query_bf16_hs128",
            "fused_attention_backward_key_value_bf16",
            "fused_attention_backward_key_value_bf16_hs128",
        ],
    },
    KernelSource {
        name: "gelu.cu",
        source: include_str!("../../cuda/gelu.cu"),
        kernels: &["gelu_forward", "gelu_forward_bf16", "gelu_backward", "gelu_backward_bf16"],
    },
    KernelSource {
        name: "layernorm.cu",
        source: include_str!("../../cuda/layernorm.cu"),
        kernels: &[
            "layernorm_forward",
            "layernorm_forward_bf16",
            "layernorm_backward_input",
            "layernorm_backward_input_bf16",
            "layernorm_backward_params_partial",
            "layernorm_backward_params_partial_bf16",
        ],
    },
    KernelSource {
        name: "loss_mean.cu",
        source: include_str!("../../cuda/loss_mean.cu"),
        kernels: &["loss_mean"],
    },
    KernelSource {
        name: "rmsnorm.cu",
        source: include_str!("../../cuda/rmsnorm.cu"),
        kernels: &[
            "rmsnorm_forward",
            "rmsnorm_forward_bf16",
            "rmsnorm_backward_input",
            "rmsnorm_backward_input_bf16",
            "rmsnorm_backward_weight_partial",
            "rmsnorm_backward_weight_partial_bf16",
        ],
    },
    KernelSource {
        name: "rope.cu",
        source: include_str!("../../cuda/rope.cu"),
        kernels: &["rope_forward", "rope_forward_bf16", "rope_backward", "rope_backward_bf16"],
    },
    KernelSource {
        name: "sum_squares.cu",
        source: include_str!("../../cuda/sum_squares.cu"),
        kernels: &["sum_squares_chunks", "sum_squares_totals"],
    },
    KernelSource {
        name: "swiglu.cu",
        source: include_str!("../../cuda/swiglu.cu"),
        kernels: &["swiglu_forward", "swiglu_forward_bf16", "swiglu_backward", "swiglu_backward_bf16"],
    },
];
