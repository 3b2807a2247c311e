"""cluster/: the Ray cluster-launcher config, the KubeRay manifests, the Dockerfile and the README.

Offline checks only (no cloud, no Kubernetes, no Ray started):

- ``cluster/aws-gpu.yaml`` against Ray's own cluster-config JSON schema and the checks
  ``ray up`` runs before it contacts AWS (``prepare_config`` + ``validate_config``);
- the KubeRay manifests against a structural schema of the ``RayCluster`` / ``RayJob``
  CRD fields they use (written here: the CRDs are not installed), plus KubeRay's and
  Kubernetes' rules the schema cannot express (replicas bounds, GPU limits);
- every quickstart command in ``cluster/`` parses with ``examples/quickstart.py``'s own
  ``parse_args``, so the manifests and docs fail here when they drift from the script;
- the files agree with each other: Ray version, image, install paths, shared mount.
"""

from __future__ import annotations

import ast
import copy
import datetime
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
AWS_CONFIG = CLUSTER / "aws-gpu.yaml"
RAYCLUSTER = CLUSTER / "kuberay" / "raycluster.yaml"
RAYJOB = CLUSTER / "kuberay" / "rayjob.yaml"
SHARED_STORAGE = CLUSTER / "kuberay" / "shared-storage.yaml"
DOCKERFILE = CLUSTER / "Dockerfile"
README = CLUSTER / "README.md"
QUICKSTART = "examples/quickstart.py"
SHARED_MOUNT = "/mnt/shared"

# AWS instance types the config may use: (vCPUs, NVIDIA GPUs), from AWS's instance type pages.
AWS_INSTANCES = {
    "m5.xlarge": (4, 0),
    "m5.2xlarge": (8, 0),
    "m5.4xlarge": (16, 0),
    "g5.xlarge": (4, 1),
    "g5.2xlarge": (8, 1),
    "g5.4xlarge": (16, 1),
    "g5.12xlarge": (48, 4),
    "g6.xlarge": (4, 1),
    "g6.2xlarge": (8, 1),
}


def load(path: Path):
    with open(path) as file:
        return yaml.safe_load(file)


@pytest.fixture(scope="module")
def aws():
    return load(AWS_CONFIG)


@pytest.fixture(scope="module")
def raycluster():
    return load(RAYCLUSTER)


@pytest.fixture(scope="module")
def rayjob():
    return load(RAYJOB)


@pytest.fixture(scope="module")
def pvc():
    return load(SHARED_STORAGE)


@pytest.fixture(scope="module")
def quickstart():
    """examples/quickstart.py, imported from its path (it is not in a package)."""
    spec = importlib.util.spec_from_file_location("_quickstart_under_test", ROOT / QUICKSTART)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\"?)(\S+?)\1$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"cluster/Dockerfile has no ARG {name}=..."
    return match.group(2)


def ray_image_version(image: str) -> tuple[str, str]:
    """("2.60.0", "py311") from rayproject/ray:2.60.0-py311-gpu (a CUDA image of a Ray release)."""
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-(py3\d+)-(gpu|cu\d+)", image)
    assert match, f"{image} is not a CUDA image of a Ray release (rayproject/ray:X.Y.Z-pyNNN-gpu)"
    return match.group(1), match.group(2)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# ----------------------------------------------------------------------------- ray up (AWS)
def test_aws_config_matches_rays_cluster_schema(aws):
    import ray

    with open(Path(ray.autoscaler.__file__).parent / "ray-schema.json") as file:
        schema = json.load(file)
    jsonschema.validate(aws, schema)


def test_aws_config_passes_the_checks_ray_up_makes_before_contacting_aws(aws):
    """What `ray up` runs first: defaults merged in, then Ray's validation (no credentials needed)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(aws))
    validate_config(prepared)
    assert prepared["available_node_types"][prepared["head_node_type"]]["max_workers"] == 0


def test_node_resources_must_be_whole_numbers_in_rays_schema(aws):
    """The README's claim: fractions of a GPU exist per trial only, never per node type."""
    import ray

    with open(Path(ray.autoscaler.__file__).parent / "ray-schema.json") as file:
        schema = json.load(file)
    broken = copy.deepcopy(aws)
    broken["available_node_types"]["gpu_worker"]["resources"]["GPU"] = 0.5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_aws_cpu_head_and_gpu_workers(aws):
    types = aws["available_node_types"]
    head = types[aws["head_node_type"]]
    assert AWS_INSTANCES[head["node_config"]["InstanceType"]][1] == 0, "the head is a CPU instance"
    assert head["resources"] == {"CPU": 0}, "no trial may be scheduled on the head"
    workers = {name: spec for name, spec in types.items() if name != aws["head_node_type"]}
    assert workers
    for name, spec in workers.items():
        cpus, gpus = AWS_INSTANCES[spec["node_config"]["InstanceType"]]
        assert gpus >= 1, f"{name} is not a GPU instance"
        assert spec["resources"] == {"CPU": cpus, "GPU": gpus}, f"{name} advertises what its instance has"
        assert 0 <= spec["min_workers"] <= spec["max_workers"] <= aws["max_workers"]
        assert spec["node_config"]["ImageId"] == head["node_config"]["ImageId"]
        assert "InstanceMarketOptions" not in spec["node_config"], "spot workers cost privacy on preemption"
    assert "--gpus all" in aws["docker"]["worker_run_options"]
    assert not any("--gpus" in option for option in aws["docker"].get("head_run_options", []))
    assert not any("--gpus" in option for option in aws["docker"]["run_options"]), "the head has no GPU"


def test_aws_region_zones_and_efs_agree(aws):
    region = aws["provider"]["region"]
    zones = aws["provider"]["availability_zone"].split(",")
    assert all(re.fullmatch(rf"{re.escape(region)}[a-z]", zone) for zone in zones)
    mount = next(command for command in aws["initialization_commands"] if "mount -t nfs4" in command)
    server = re.search(r"(fs-\S+?)\.efs\.([a-z0-9-]+)\.amazonaws\.com:/ ([^\s;]+)", mount)
    assert server, "the EFS mount names fs-ID.efs.REGION.amazonaws.com:/ and a mount point"
    assert server.group(2) == region, "EFS must be in the cluster's region"
    assert server.group(3) == SHARED_MOUNT
    assert f"--volume {SHARED_MOUNT}:{SHARED_MOUNT}" in aws["docker"]["run_options"]


def test_aws_installs_this_checkout_with_a_cuda_torch(aws):
    ((remote, local),) = aws["file_mounts"].items()
    assert local == ".", "file_mounts copies the repository root (ray up runs from it)"
    assert {".venv", ".git"} <= set(aws["rsync_exclude"])
    commands = aws["setup_commands"]
    assert f"pip install -q {remote}" in commands
    torch = next(command for command in commands if "torch" in command)
    assert shlex.split(torch)[-1] == dockerfile_arg("TORCH_SPEC"), "same torch as the KubeRay image"
    assert commands.index(torch) < commands.index(f"pip install -q {remote}")


def test_aws_commands_are_valid_shell(aws):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash to check the syntax with")
    keys = [
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ]
    for command in (command for key in keys for command in aws.get(key, [])):
        result = subprocess.run([bash, "-n", "-c", command], capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{command!r}: {result.stderr}"


# ----------------------------------------------------------------------------- KubeRay schemas
# The CRD fields these manifests use, from KubeRay's API types (ray-operator/apis/ray/v1) and
# Kubernetes' core/v1 types (a subset of their fields: list a real field here before using it).
# additionalProperties is false on the objects described, so a misspelt field fails here as
# `kubectl apply` (strict field validation) would fail.
QUANTITY = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE])?$"},
    ]
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
DNS_LABEL = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {"name": DNS_LABEL, "namespace": DNS_LABEL, "labels": STRING_MAP, "annotations": STRING_MAP},
}
RESOURCES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "requests": {"type": "object", "additionalProperties": QUANTITY},
        "limits": {"type": "object", "additionalProperties": QUANTITY},
        "claims": {"type": "array"},
    },
}
CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "additionalProperties": False,
    "properties": {
        "name": DNS_LABEL,
        "image": {"type": "string", "minLength": 1},
        "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "workingDir": {"type": "string"},
        "env": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "value": {"type": "string"},
                    "valueFrom": {"type": "object"},
                },
            },
        },
        "envFrom": {"type": "array"},
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["containerPort"],
                "additionalProperties": False,
                "properties": {
                    "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 15},
                    "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
                    "hostPort": {"type": "integer"},
                    "hostIP": {"type": "string"},
                },
            },
        },
        "resources": RESOURCES,
        "volumeMounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "mountPath"],
                "additionalProperties": False,
                "properties": {
                    "name": DNS_LABEL,
                    "mountPath": {"type": "string", "pattern": "^/"},
                    "readOnly": {"type": "boolean"},
                    "subPath": {"type": "string"},
                    "subPathExpr": {"type": "string"},
                    "mountPropagation": {"type": "string"},
                },
            },
        },
        "lifecycle": {"type": "object"},
        "livenessProbe": {"type": "object"},
        "readinessProbe": {"type": "object"},
        "startupProbe": {"type": "object"},
        "securityContext": {"type": "object"},
        "terminationMessagePath": {"type": "string"},
        "terminationMessagePolicy": {"type": "string"},
        "stdin": {"type": "boolean"},
        "tty": {"type": "boolean"},
    },
}
VOLUME = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "minProperties": 2,
    "properties": {
        "name": DNS_LABEL,
        "persistentVolumeClaim": {
            "type": "object",
            "required": ["claimName"],
            "additionalProperties": False,
            "properties": {"claimName": DNS_LABEL, "readOnly": {"type": "boolean"}},
        },
        "emptyDir": {"type": "object"},
        "configMap": {"type": "object"},
        "secret": {"type": "object"},
        "nfs": {"type": "object"},
        "csi": {"type": "object"},
        "hostPath": {"type": "object"},
    },
}
TOLERATION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "key": {"type": "string"},
        "operator": {"enum": ["Exists", "Equal"]},
        "value": {"type": "string"},
        "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
        "tolerationSeconds": {"type": "integer"},
    },
}
POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "additionalProperties": False,
    "properties": {
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"labels": STRING_MAP, "annotations": STRING_MAP, "name": DNS_LABEL},
        },
        "spec": {
            "type": "object",
            "required": ["containers"],
            "additionalProperties": False,
            "properties": {
                "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
                "initContainers": {"type": "array", "items": CONTAINER},
                "volumes": {"type": "array", "items": VOLUME},
                "tolerations": {"type": "array", "items": TOLERATION},
                "nodeSelector": STRING_MAP,
                "affinity": {"type": "object"},
                "serviceAccountName": {"type": "string"},
                "securityContext": {"type": "object"},
                "imagePullSecrets": {"type": "array"},
                "priorityClassName": {"type": "string"},
                "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
                "terminationGracePeriodSeconds": {"type": "integer"},
                "runtimeClassName": {"type": "string"},
            },
        },
    },
}
RAY_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}  # KubeRay: strings only
REPLICAS = {"type": "integer", "minimum": 0}
CLUSTER_SPEC = {
    "type": "object",
    "required": ["headGroupSpec"],
    "additionalProperties": False,
    "properties": {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
                "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
                "resources": RESOURCES,
                "image": {"type": "string"},
                "imagePullPolicy": {"type": "string"},
                "env": {"type": "array"},
                "envFrom": {"type": "array"},
                "volumeMounts": {"type": "array"},
                "securityContext": {"type": "object"},
            },
        },
        "headServiceAnnotations": STRING_MAP,
        "suspend": {"type": "boolean"},
        "headGroupSpec": {
            "type": "object",
            "required": ["rayStartParams", "template"],
            "additionalProperties": False,
            "properties": {
                "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                "headService": {"type": "object"},
                "enableIngress": {"type": "boolean"},
                "rayStartParams": RAY_START_PARAMS,
                "template": POD_TEMPLATE,
            },
        },
        "workerGroupSpecs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"],
                "additionalProperties": False,
                "properties": {
                    "groupName": DNS_LABEL,
                    "replicas": REPLICAS,
                    "minReplicas": REPLICAS,
                    "maxReplicas": REPLICAS,
                    "numOfHosts": {"type": "integer", "minimum": 1},
                    "rayStartParams": RAY_START_PARAMS,
                    "template": POD_TEMPLATE,
                    "scaleStrategy": {"type": "object"},
                },
            },
        },
    },
}
RAYCLUSTER_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": OBJECT_META,
        "spec": CLUSTER_SPEC,
    },
}
RAYJOB_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            # rayClusterSpec: the CRD also allows clusterSelector (an existing cluster); this one brings its own.
            "required": ["entrypoint", "rayClusterSpec"],
            "additionalProperties": False,
            "properties": {
                "entrypoint": {"type": "string", "minLength": 1},
                "runtimeEnvYAML": {"type": "string"},
                "jobId": {"type": "string"},
                "metadata": STRING_MAP,
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode"]},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "backoffLimit": {"type": "integer", "minimum": 0},
                "submitterConfig": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"backoffLimit": {"type": "integer", "minimum": 0}},
                },
                "submitterPodTemplate": POD_TEMPLATE,
                "entrypointNumCpus": {"type": "number", "minimum": 0},
                "entrypointNumGpus": {"type": "number", "minimum": 0},
                "entrypointResources": {"type": "string"},
                "suspend": {"type": "boolean"},
                "rayClusterSpec": CLUSTER_SPEC,
            },
        },
    },
}
PVC_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "v1"},
        "kind": {"const": "PersistentVolumeClaim"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["accessModes", "resources"],
            "additionalProperties": False,
            "properties": {
                "accessModes": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]},
                },
                "storageClassName": {"type": "string"},
                "volumeMode": {"enum": ["Filesystem", "Block"]},
                "resources": {
                    "type": "object",
                    "required": ["requests"],
                    "additionalProperties": False,
                    "properties": {
                        "requests": {"type": "object", "required": ["storage"], "properties": {"storage": QUANTITY}}
                    },
                },
            },
        },
    },
}


def quantity(value) -> float:
    """A Kubernetes quantity ("500m", "8Gi", "2", 4) as a number."""
    match = re.fullmatch(r"([0-9.]+)([KMGTPE]i|[numkMGTPE])?", str(value))
    assert match, f"not a quantity: {value!r}"
    suffixes = {
        None: 1,
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }
    return float(match.group(1)) * suffixes[match.group(2)]


def cluster_specs(raycluster, rayjob):
    return {"raycluster.yaml": raycluster["spec"], "rayjob.yaml": rayjob["spec"]["rayClusterSpec"]}


def test_manifests_match_the_crd_structure(raycluster, rayjob, pvc):
    jsonschema.validate(raycluster, RAYCLUSTER_SCHEMA)
    jsonschema.validate(rayjob, RAYJOB_SCHEMA)
    jsonschema.validate(pvc, PVC_SCHEMA)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda m: m["spec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 0}),  # not a string
        lambda m: m["spec"].update({"workerGroupSpec": m["spec"].pop("workerGroupSpecs")}),  # misspelt
        lambda m: m["spec"]["workerGroupSpecs"][0].pop("maxReplicas"),
        lambda m: m["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].update({"resource": {}}),
        lambda m: m["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(
            {"memory": "8 GB"}
        ),
    ],
)
def test_the_schema_catches_real_mistakes(raycluster, break_it):
    broken = copy.deepcopy(raycluster)
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, RAYCLUSTER_SCHEMA)


def test_rayjob_brings_the_same_cluster_as_raycluster(raycluster, rayjob):
    assert rayjob["spec"]["rayClusterSpec"] == raycluster["spec"]


def test_cpu_head_and_gpu_worker_groups(raycluster, rayjob):
    for name, spec in cluster_specs(raycluster, rayjob).items():
        head = spec["headGroupSpec"]
        assert head["rayStartParams"].get("num-cpus") == "0", f"{name}: trials must not run on the head"
        for container in head["template"]["spec"]["containers"]:
            resources = container.get("resources", {})
            assert "nvidia.com/gpu" not in {**resources.get("requests", {}), **resources.get("limits", {})}
        assert spec["workerGroupSpecs"], f"{name}: no worker group"
        for group in spec["workerGroupSpecs"]:
            low, high = group["minReplicas"], group["maxReplicas"]
            assert low <= group.get("replicas", low) <= high, f"{name}: {group['groupName']} replicas out of bounds"
            container = group["template"]["spec"]["containers"][0]  # KubeRay runs Ray in the first container
            limits, requests = container["resources"]["limits"], container["resources"].get("requests", {})
            assert quantity(limits.get("nvidia.com/gpu", 0)) >= 1, f"{name}: {group['groupName']} has no GPU limit"
            # Kubernetes: an extended resource's request, when given, must equal its limit.
            assert requests.get("nvidia.com/gpu", limits["nvidia.com/gpu"]) == limits["nvidia.com/gpu"]
            for resource in ("cpu", "memory"):
                assert quantity(requests.get(resource, limits[resource])) <= quantity(limits[resource])
            assert "num-gpus" not in group["rayStartParams"] or group["rayStartParams"]["num-gpus"] == str(
                limits["nvidia.com/gpu"]
            )


def test_every_node_mounts_the_shared_claim(raycluster, rayjob, pvc):
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "all nodes mount it at once"
    claim = pvc["metadata"]["name"]
    for name, spec in cluster_specs(raycluster, rayjob).items():
        groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
        for group_name, group in groups:
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0].get("volumeMounts", [])}
            assert SHARED_MOUNT in mounts, f"{name}: {group_name} does not mount {SHARED_MOUNT}"
            volume = volumes[mounts[SHARED_MOUNT]]
            assert volume.get("persistentVolumeClaim", {}).get("claimName") == claim, f"{name}: {group_name}"


def test_images_and_ray_versions_agree(aws, raycluster, rayjob):
    base_version, python = ray_image_version(dockerfile_arg("RAY_IMAGE"))
    assert ray_image_version(aws["docker"]["image"]) == (base_version, python)
    images = set()
    for spec in cluster_specs(raycluster, rayjob).values():
        assert spec["rayVersion"] == base_version
        groups = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
        images |= {c["image"] for g in groups for c in g["template"]["spec"]["containers"]}
    (image,) = images  # one image everywhere: head, workers, and so the submitter pod
    assert image.endswith(f"-ray{base_version}-{python}-gpu"), f"{image}: its tag names the Ray image it is built on"
    assert f"-t {image} ." in DOCKERFILE.read_text(), "the Dockerfile's build command tags this image"
    minimum = re.search(r'"ray\[tune\]>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert version_tuple(base_version) >= version_tuple(minimum)


def test_the_image_holds_what_the_rayjob_runs(rayjob):
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    dockerfile = DOCKERFILE.read_text()
    working_dir = runtime_env["working_dir"]
    for source in ("pyproject.toml", "ray_dptune", "examples"):
        assert (ROOT / source).exists()
        assert re.search(rf"^COPY .*\b{source}\b.* {re.escape(working_dir)}/", dockerfile, re.MULTILINE), (
            f"cluster/Dockerfile does not copy {source} into the job's working_dir {working_dir}"
        )
    assert re.search(r"^RUN pip install .*\.", dockerfile, re.MULTILINE), "the image installs ray_dptune"


def test_rayjob_runtime_env_is_valid_for_ray(rayjob):
    from ray.runtime_env import RuntimeEnv

    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert isinstance(runtime_env, dict) and set(runtime_env) <= RuntimeEnv.known_fields
    # working_dir is the image's copy of this repository (checked above): validate it as this checkout.
    RuntimeEnv(**{**runtime_env, "working_dir": str(ROOT)})


def test_rayjob_runs_once_and_cleans_up(rayjob):
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["submissionMode"] == "K8sJobMode", "the submitter pod uploads the image's working_dir"
    assert spec["backoffLimit"] == 0, "a retry would be a new search, spending epsilon again"
    assert spec["submitterConfig"]["backoffLimit"] == 0, "a resubmission after a head restart would be a new search"


# ----------------------------------------------------------------------------- the quickstart's arguments
def quickstart_invocations() -> list[tuple[str, list[str]]]:
    """Every `python .../examples/quickstart.py ARGS` or `ray submit CFG examples/quickstart.py -- ARGS`
    written in cluster/ (README, config comments, the RayJob's entrypoint), with its ARGS."""
    command = re.compile(r"(?:python|ray submit \S+) \S*" + re.escape(QUICKSTART) + r"(?P<args>[^`#\n]*)")
    found = []
    for path in sorted(CLUSTER.rglob("*")):
        if path.is_file() and path.suffix in {".md", ".yaml", ""}:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in command.finditer(line):
                    args = shlex.split(match.group("args"))
                    found.append((f"{path.relative_to(ROOT)}:{number}", [a for a in args if a != "--"]))
    return found


def test_rayjob_entrypoint_runs_the_quickstart_with_arguments_it_accepts(rayjob, quickstart):
    tokens = shlex.split(rayjob["spec"]["entrypoint"])
    assert tokens[:2] == ["python", QUICKSTART], "run from working_dir, where the image put the repository"
    try:
        args = quickstart.parse_args(tokens[2:])
    except SystemExit:
        pytest.fail(f"examples/quickstart.py rejects the RayJob's arguments {tokens[2:]}")
    assert args.storage and args.storage.startswith(SHARED_MOUNT + "/"), "the experiment must be on shared storage"
    spec = rayjob["spec"]["rayClusterSpec"]
    cpus = sum(
        g["maxReplicas"] * quantity(g["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
        for g in spec["workerGroupSpecs"]
    )
    assert 1 <= args.concurrency <= cpus, "each quickstart trial takes one worker CPU"


def test_every_quickstart_command_in_cluster_parses_with_its_own_parser(quickstart):
    invocations = quickstart_invocations()
    assert len(invocations) >= 5, invocations  # README, aws-gpu.yaml, raycluster.yaml, rayjob.yaml
    for where, args in invocations:
        try:
            parsed = quickstart.parse_args(args)
        except SystemExit:
            pytest.fail(f"{where}: examples/quickstart.py rejects {args}")
        assert parsed.storage and parsed.storage.startswith(SHARED_MOUNT + "/"), f"{where}: --storage not shared"


# ----------------------------------------------------------------------------- README
def test_readme_names_only_files_that_exist():
    for name in set(re.findall(r"cluster/[\w./-]+\.(?:yaml|md|py)|cluster/Dockerfile\b", README.read_text())):
        assert (ROOT / name).exists(), f"cluster/README.md names {name}"


def test_every_placeholder_is_documented_in_the_readme():
    readme = README.read_text()
    placeholder = re.compile(r"fs-REPLACE_ME|REPLACE_ME_[A-Z_]+|[\w.-]+/replace-me/[\w.:-]*\w")
    for path in [AWS_CONFIG, RAYCLUSTER, RAYJOB, SHARED_STORAGE, DOCKERFILE]:
        text = path.read_text()
        found = placeholder.findall(text)
        assert len(found) == len(re.findall(r"replace[-_]me", text, re.IGNORECASE)), f"{path}: unknown placeholder form"
        for token in set(found):
            assert token in readme, (
                f"{path.relative_to(ROOT)}: placeholder {token} is not explained in cluster/README.md"
            )


def test_readme_restore_snippet_rebuilds_the_quickstarts_trainable(quickstart):
    """The restore example rebuilds the quickstart's trainable with its defaults and no noise multiplier
    (private_tuner keeps the calibrated σ in the search's param_space, which Tune restores)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    (snippet,) = [block for block in blocks if "Tuner.restore" in block]
    calls = [
        node
        for node in ast.walk(ast.parse(snippet))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dp_trainable"
    ]
    assert len(calls) == 1, "one trainable, built once"
    keywords = {kw.arg: ast.literal_eval(kw.value) for kw in calls[0].keywords}
    defaults = vars(quickstart.parse_args([]))
    assert keywords == {"batch_size": defaults["batch_size"], "epochs": defaults["epochs"]}
    assert "calibrate_noise_multiplier" not in snippet
    restored = re.search(r'Tuner\.restore\("([^"]+)"', snippet).group(1)
    assert restored.startswith(SHARED_MOUNT + "/")
    datetime.datetime.strptime(restored.rsplit("/", 1)[1], quickstart.NAME_FORMAT)  # a folder the quickstart names
