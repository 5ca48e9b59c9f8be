#!/usr/bin/env bash
# The wheels the offline GPU check (bench/device_check.sh) needs, for a GPU machine that reaches no
# package registry: run here, carry the result (`.whl`, ignored by git) with the call there.
#
# That machine already has Python 3.12 with torch, transformers, peft, accelerate, safetensors,
# tokenizers, numpy, pillow, httpx, aiohttp, prometheus-client, pyyaml, tqdm, matplotlib, pytest
# and more (MACHINE_HAS below, as its image was last read). It lacks the agent and serving side:
# pydantic, starlette, uvicorn, openai, strands-agents, bedrock-agentcore, boto3, and what they need;
# and its transformers and peft are other releases than constraints.txt's, so those travel too.
# This script
#   1. downloads exactly those (cp312 manylinux x86-64 or pure-Python wheels, no dependencies
#      resolved by pip: PACK lists them all, at constraints.txt's versions) into .whl/, and deletes
#      any other wheel there;
#   2. checks the set installs offline for Python 3.12: pip resolves the top-level requirements from
#      .whl/ alone (--no-index), with empty placeholder wheels standing in for MACHINE_HAS and for
#      LEFT_OUT, and every wheel in .whl/ must be used;
#   3. fails with a sentence when .whl/ passes 48 MiB (the call carries 64 MiB, the tree included).
#
# Left out (LEFT_OUT), because the check never imports them: mlflow-skinny (the check's runs set
# mlflow_tracking_uri: none), mcp (strands-agents' MCP client), ray (no ray section), gguf (SmolLM2's
# converter: SmolLM2's 93 MB wheel does not fit anyway), vllm (its wheels are hundreds of MB).
#
#   bench/device_pack.sh            # download (cached: wheels already in .whl/ are kept) and check
#   bench/device_pack.sh --check    # check .whl/ only, offline
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DEST=${DEST:-.whl}
LIMIT_MIB=${LIMIT_MIB:-48}

# What the check imports that the machine lacks, and their own needs it lacks (names as in
# constraints.txt). typing-extensions and idna are there, but pydantic and httpx2 need releases newer
# than the machine may have (4.16, 3.18): carried, they are tiny. transformers and peft are there too,
# at other releases than constraints.txt pins: carried (pure Python, 14 MB), they make the check run
# the numeric stack users install, torch aside.
PACK="transformers peft pydantic pydantic_core annotated-types typing-inspection starlette uvicorn httptools python-multipart
openai jiter sniffio httpx2 httpcore2 truststore strands-agents docstring_parser jsonschema
jsonschema-specifications referencing rpds-py opentelemetry-api opentelemetry-sdk
opentelemetry-semantic-conventions opentelemetry-instrumentation opentelemetry-instrumentation-threading
watchdog bedrock-agentcore websockets boto3 botocore s3transfer jmespath
typing_extensions idna"
# The top-level requirements the check's code imports (the rest of PACK is what they need).
TOP="transformers peft pydantic starlette uvicorn httptools python-multipart openai strands-agents bedrock-agentcore boto3"
LEFT_OUT="mcp mlflow-skinny ray gguf vllm"
# The GPU machine's image (/work/.library/device/KINDS.md), the names that matter here.
MACHINE_HAS="accelerate aiohappyeyeballs aiohttp aiosignal anyio attrs certifi click filelock frozenlist
fsspec h11 httpcore httpx huggingface-hub jinja2 markupsafe matplotlib multidict numpy packaging peft
pillow prometheus-client propcache protobuf psutil python-dateutil pyyaml regex requests rich
safetensors six sympy tokenizers torch tqdm transformers typer urllib3 wrapt yarl zipp pytest
pytest-xdist hypothesis"

fail() {
    echo "device_pack: $*" >&2
    exit 1
}

version_of() {  # the version constraints.txt pins for a name (case and -/_ insensitive)
    local key
    key=$(echo "$1" | tr 'A-Z_' 'a-z-')
    awk -F'==' -v key="$key" '{ name = tolower($1); gsub("_", "-", name); if (name == key) print $2 }' \
        constraints.txt | head -1
}

PLATFORMS=""
for platform in manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
    PLATFORMS="$PLATFORMS --platform $platform"
done
TARGET_FLAGS="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 $PLATFORMS"

pinned=()
for name in $PACK; do
    version=$(version_of "$name")
    [ -n "$version" ] || fail "constraints.txt pins no version of $name: add it there first"
    pinned+=("$name==$version")
done

if [ "${1:-}" != "--check" ]; then
    mkdir -p "$DEST"
    echo "device_pack: downloading ${#pinned[@]} wheels into $DEST/"
    # shellcheck disable=SC2086
    "$PYTHON" -m pip download -q --no-deps $TARGET_FLAGS -d "$DEST" "${pinned[@]}" \
        || fail "pip could not download the wheels (is a package registry reachable?); its output is above"
fi
[ -d "$DEST" ] || fail "$DEST/ does not exist: run bench/device_pack.sh (without --check) first"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Keep exactly PACK's wheels (an older version or a wheel of another name would install beside them),
# make placeholder wheels for what the machine has and what is left out, list the top-level pins.
STUBS="$MACHINE_HAS $LEFT_OUT" "$PYTHON" - "$DEST" "$work" "${pinned[@]}" <<'PY' || exit 1
import base64, hashlib, os, re, sys, zipfile
from pathlib import Path

dest, work, pins = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
wanted = {norm(pin.split("==")[0]): pin.split("==")[1] for pin in pins}
have: dict[str, list[Path]] = {}
for wheel in sorted(dest.glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    if wanted.get(norm(name)) == version:
        have.setdefault(norm(name), []).append(wheel)
    else:
        print(f"device_pack: removing {wheel.name} (not in the pack)")
        wheel.unlink()
missing = sorted(set(wanted) - set(have))
if missing:
    sys.exit(f"device_pack: {dest}/ lacks {', '.join(missing)}: run bench/device_pack.sh (without --check)")
doubled = sorted(name for name, wheels in have.items() if len(wheels) > 1)
if doubled:
    sys.exit(f"device_pack: {dest}/ holds two wheels of {', '.join(doubled)}: delete one")


def placeholder(name: str, version: str) -> None:
    """An empty wheel named ``name`` at ``version``: it satisfies a requirement and installs nothing."""
    dist = f"{re.sub(r'[-.]+', '_', name)}-{version}"
    files = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}\n"
        for path, text in files.items()
    )
    files[f"{dist}.dist-info/RECORD"] = record + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(work / "stubs" / f"{dist}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)


(work / "stubs").mkdir()
constraints = {}
for line in Path("constraints.txt").read_text().splitlines():
    if "==" in line and not line.startswith("#"):
        key, version = line.split("==", 1)
        constraints[norm(key)] = version.strip()
for name in os.environ["STUBS"].split():
    if norm(name) not in wanted:  # a carried wheel wins over the machine's copy
        placeholder(name, constraints.get(norm(name), "9999"))
PY

# Offline: the top-level requirements resolve from .whl/ and the placeholders, for CPython 3.12.
top=()
for name in $TOP; do top+=("$name==$(version_of "$name")"); done
# shellcheck disable=SC2086
if ! PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="" PIP_CONSTRAINT="" "$PYTHON" -m pip install -q --dry-run \
    --no-index --find-links "$DEST" --find-links "$work/stubs" --target "$work/target" $TARGET_FLAGS \
    --report "$work/report.json" "${top[@]}"; then
    fail "the wheels in $DEST/ do not install offline for CPython 3.12 (pip's reason is above): rerun bench/device_pack.sh"
fi
"$PYTHON" - "$DEST" "$work/report.json" <<'PY' || exit 1
import json, sys
from pathlib import Path

dest, report = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
used = {Path(item["download_info"]["url"].removeprefix("file://")).name for item in report["install"]}
unused = sorted(wheel.name for wheel in dest.glob("*.whl") if wheel.name not in used)
if unused:
    sys.exit(f"device_pack: the offline install does not use {', '.join(unused)}: drop it from PACK")
PY

bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
count=$(ls "$DEST"/*.whl | wc -l)
if [ "$bytes" -gt $((LIMIT_MIB * 1048576)) ]; then
    fail "$DEST/ holds $mib MiB of wheels, more than ${LIMIT_MIB} MiB: with the working tree it would pass the 64 MiB a device call carries; leave a package out (LEFT_OUT)"
fi
echo "device_pack: $count wheels, $mib MiB in $DEST/, installable offline for CPython 3.12 on manylinux x86-64"
