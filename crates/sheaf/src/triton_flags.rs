//! tritonserver's command-line flags that `sheaf serve` does not take, each with what to do
//! instead: a Triton command line brought as it is gets, beside the parser's "unexpected
//! argument", the reason and sheaf's way to the same end. The flags sheaf does take are
//! ordinary arguments of [`crate::cli::ServeArgs`].

/// Each flag not taken, and what to do instead.
const NOT_TAKEN: &[(&str, &str)] = &[
    ("--backend-directory", "sheaf's backends (ONNX Runtime, Python, llama.cpp) are built in; remove the flag, and point --onnxruntime-lib at another ONNX Runtime if needed"),
    ("--repoagent-directory", "sheaf has no repository agents; remove the flag"),
    ("--cache-directory", "sheaf's response cache is built in: --cache-config local,size=BYTES"),
    ("--response-cache-byte-size", "give --cache-config local,size=BYTES (or --cache-size BYTES)"),
    ("--pinned-memory-pool-byte-size", "sheaf keeps pinned staging memory per model instance, sized by its batches; remove the flag"),
    ("--cuda-memory-pool-byte-size", "sheaf sizes GPU memory per model (the `cuda` section's gpu_mem_limit) and books it in the manager's budgets (the server configuration's devices); remove the flag"),
    ("--cuda-virtual-address-size", "sheaf sizes GPU memory per model (the `cuda` section); remove the flag"),
    ("--min-supported-compute-capability", "the ONNX Runtime CUDA build decides which GPUs it runs on; remove the flag"),
    ("--host-policy", "place instances with a model's instance_cpus and the server's threads with --io-cpus"),
    ("--buffer-manager-thread-count", "sheaf's server threads are set with --io-cpus; remove the flag"),
    ("--http-thread-count", "sheaf's server threads are set with --io-cpus; remove the flag"),
    ("--grpc-infer-thread-count", "sheaf's gRPC calls run on its server threads, set with --io-cpus; remove the flag"),
    ("--grpc-max-response-pool-size", "sheaf allocates gRPC answers per call; remove the flag"),
    ("--enable-peer-access", "sheaf leaves GPU peer access to the CUDA driver and ONNX Runtime; remove the flag"),
    ("--model-load-gpu-limit", "give the devices a memory budget, memory_budget_mb in the --config file (a model that does not fit is not loaded, or idle ones are unloaded first)"),
    ("--grpc-infer-allocation-pool-size", "sheaf allocates gRPC requests per call; remove the flag"),
    ("--grpc-keepalive-permit-without-calls", "sheaf's gRPC server answers a client's pings at any rate, with calls or without, and never closes a connection over them; remove the flag"),
    ("--grpc-http2-max-pings-without-data", "sheaf's gRPC server answers a client's pings at any rate and never closes a connection over them; remove the flag"),
    ("--grpc-http2-min-recv-ping-interval-without-data", "sheaf's gRPC server answers a client's pings at any rate and never closes a connection over them; remove the flag"),
    ("--grpc-http2-max-ping-strikes", "sheaf's gRPC server answers a client's pings at any rate and never closes a connection over them; remove the flag"),
    ("--vertex-ai-thread-count", "sheaf's server threads are set with --io-cpus; remove the flag"),
    ("--sagemaker-thread-count", "sheaf's server threads are set with --io-cpus; remove the flag"),
];

/// The reason a tritonserver flag in `error` (the parser's "unexpected argument") is not
/// taken, as a line to print after the parser's message; none for any other error.
pub fn why_not(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(given)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = given.split('=').next().unwrap_or(given);
    NOT_TAKEN
        .iter()
        .find(|(name, _)| *name == flag)
        .map(|(name, why)| format!("tritonserver's {name} is not one of sheaf's flags: {why}."))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn a_triton_flag_not_taken_is_named_with_what_to_do() {
        let parsed = crate::cli::Cli::try_parse_from([
            "sheaf",
            "serve",
            "--pinned-memory-pool-byte-size=268435456",
        ]);
        let why = super::why_not(&parsed.unwrap_err()).unwrap();
        assert!(
            why.starts_with(
                "tritonserver's --pinned-memory-pool-byte-size is not one of sheaf's flags: "
            ),
            "{why}"
        );
        let parsed = crate::cli::Cli::try_parse_from(["sheaf", "serve", "--http-thread-count=8"]);
        let why = super::why_not(&parsed.unwrap_err()).unwrap();
        assert!(why.contains("--io-cpus"), "{why}");
        // Anything else: the parser's message alone.
        let parsed = crate::cli::Cli::try_parse_from(["sheaf", "serve", "--no-such-flag"]);
        assert_eq!(super::why_not(&parsed.unwrap_err()), None);
        // Every flag named is one sheaf does not take.
        for (flag, _) in super::NOT_TAKEN {
            let parsed = crate::cli::Cli::try_parse_from(["sheaf", "serve", flag]);
            assert!(super::why_not(&parsed.unwrap_err()).is_some(), "{flag}");
        }
    }
}
