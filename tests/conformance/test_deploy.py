"""The packaging in deploy/, checked offline: the Kubernetes manifests against the Kubernetes
API schemas (kubernetes-validate, strict: an unexpected field fails), the KServe resources'
containers as Kubernetes containers and their references to each other, the flags they pass
against `sheaf serve --help`, and the container recipes' pins against scripts/setup.sh."""
import os
import re
import subprocess

import kubernetes_validate
import yaml

from conftest import ROOT

DEPLOY = ROOT / "deploy"


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def validate(resource):
    kubernetes_validate.validate(resource, "1.37.0", strict=True)


def test_kubernetes_manifests_follow_the_api_schemas():
    kinds = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in documents(path):
            validate(doc)
            kinds.append(doc["kind"])
    assert sorted(kinds) == ["Deployment", "Deployment", "Deployment", "HorizontalPodAutoscaler",
                             "Service", "Service"]
    deployment = next(d for d in documents(DEPLOY / "k8s/sheaf.yaml") if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    # The pod is given time for the whole drain: serving unready, then the admitted requests.
    args = container["args"]
    assert all(a in sheaf_flags() for a in args if a.startswith("--")), args
    seconds = {flag: float(args[args.index(flag) + 1])
               for flag in ("--drain-delay", "--shutdown-timeout")}
    assert seconds["--drain-delay"] > 0
    assert pod["spec"]["terminationGracePeriodSeconds"] > sum(seconds.values())
    hpa = documents(DEPLOY / "k8s/autoscaler.yaml")[0]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "sheaf_queue_depth"


def sheaf_flags():
    binary = os.environ.get("SHEAF_BIN", str(ROOT / "target/debug/sheaf"))
    text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True,
                          check=True).stdout
    return set(re.findall(r"--[a-z-]+", text))


def test_queue_workers_and_gateways_pass_flags_sheaf_takes():
    flags = sheaf_flags()
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in documents(DEPLOY / "k8s/queue.yaml") if d["kind"] == "Deployment"}
    assert set(pods) == {"sheaf-worker", "sheaf-gateway"}
    for name, pod in pods.items():
        container = pod["containers"][0]
        given = container.get("command", [])[2:] + container["args"]
        assert "--queue" in given, name
        for arg in given:
            if arg.startswith("--"):
                assert arg in flags, (name, arg)
    # The gateway serves no repository of its own; the workers keep the image's.
    assert "--model-repository" not in pods["sheaf-gateway"]["containers"][0]["command"]
    assert "command" not in pods["sheaf-worker"]["containers"][0]


def test_the_kserve_runtime_runs_sheaf_with_flags_it_takes():
    runtime = documents(DEPLOY / "kserve/servingruntime.yaml")[0]
    service = documents(DEPLOY / "kserve/inferenceservice.yaml")[0]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["kind"] == "ServingRuntime"
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["kind"] == "InferenceService"
    spec = runtime["spec"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"onnx", "gguf"}
    assert "v2" in spec["protocolVersions"]
    # Its containers are Kubernetes containers: validated inside a Pod.
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
              "spec": {"containers": spec["containers"]}})
    flags = sheaf_flags()
    for arg in spec["containers"][0]["args"]:
        assert arg.split("=")[0] in flags, arg
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in spec["supportedModelFormats"]}
    assert model["protocolVersion"] == "v2"


def test_the_container_recipes_use_the_setup_pins():
    setup = (ROOT / "scripts/setup.sh").read_text()
    ort = re.search(r"^ORT_VERSION=(\S+)", setup, re.M).group(1)
    gpu = re.search(r"GPU_WHEELS=\(([^)]*)\)", setup).group(1).split()
    cpu_recipe = (DEPLOY / "Dockerfile.cpu").read_text()
    cuda_recipe = (DEPLOY / "Dockerfile.cuda").read_text()
    assert f"onnxruntime=={ort}" in cpu_recipe
    assert f"onnxruntime-gpu=={ort}" in cuda_recipe
    for pin in ("NUMPY_VERSION", "SKLEARN_VERSION", "PILLOW_VERSION"):
        version = re.search(rf"^{pin}=(\S+)", setup, re.M).group(1)
        for recipe in (cpu_recipe, cuda_recipe):
            assert f"=={version}" in recipe, pin
    for wheel in gpu:
        assert wheel in cuda_recipe, wheel
    assert "--features cuda" in cuda_recipe
    assert 'cuda = ["sheaf-llama/cuda"]' in (ROOT / "crates/sheaf/Cargo.toml").read_text()
    for recipe in (cpu_recipe, cuda_recipe):
        for source in re.findall(r"^COPY (?!--from)(\S+)", recipe, re.M):
            assert (ROOT / source).exists(), source
