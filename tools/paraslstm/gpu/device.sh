#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# The ParaSLSTM stack in the packed vLLM (0.34.0) on the GPU machine (device
# tool), in stages; docs/gpu.md has the calls. Runs from the repo root there. Logs go
# to $OUT (the device tool's return folder) when it is set, else ./out/gpu.
#
#   a         unpack .gpuvllm/a (the kernel library) into /tmp/site; when the
#             pack split it (a/*.00 + a2/*.01), keep the first part for a2
#   a2        join the two parts of a split kernel library and unpack it
#   b         unpack .gpuvllm/b (the rest of vLLM) there, install the series
#             (paraslstm_series.tar, checked against the pristine files)
#   tests     the whole stack's tests (series.py tests) inside the patched
#             tests/ (pristine tests/ from .gpuvllm/t, the stack's files
#             installed over it), one pytest after the other
#   stack     every prefix of the stack (b/paraslstm_series-<folder>.tar) in
#             its own copy of vLLM and tests/, the tests its last PR adds or
#             changes (as bisect_series.sh on CPU), all at once
#   project ["A"]  project_tests/intree (or the selection A) in the patched
#             tree of the whole stack (after tests)
#   ptests    the whole stack's tests (series.py tests) in the patched
#             tests/, all at once on GPU 0
#   pproject  project_tests/intree (or the files $PARASLSTM_PROJECT_FILES),
#             one pytest per file, all at once (after b)
#   pplugin   project_tests/plugin files (default: the sampled-speculation
#             checks; or the files $PARASLSTM_PLUGIN_FILES) against the
#             patched vLLM, one pytest per file, all at once (after b)
#   series F  the stack up to PR folder F (or `all`) in $SITE instead of
#             the whole stack (the tarballs of .gpuvllm/s in .gpuvllm/b)
#   plugin    the plugin (pip install .) on the pack's pristine vLLM: the
#             smoke test and the KJV model's generation
#   parallel  the tensor/pipeline-parallel tests (two GPUs)
#   intree "A"  pytest A (a selection of the patched tree's tests) on GPU 0
#   only "A"  pytest A (a space-separated selection) on GPU 0
#   bench S   benchmarks/paraslstm/benchmark_engine_gpu.py --suite S
#   rounds S M N  suite S, models M (comma-separated), N interleaved rounds,
#             default multiprocess engine, no decode1 (the engine ratios)
#   benchpair S1 S2   suite S1 on GPU 0 and S2 on GPU 1, at the same time
#   kernelbench  the decode/scan kernel benchmark against the copy ceiling
#   serve S "ARGS"  benchmarks/paraslstm/benchmark_serving.py --suite S ARGS
#             (vllm serve + vllm bench serve; the server's extra packages
#             from .gpuvllm/t), results to serving-S.jsonl (and .png where
#             matplotlib is), each server's log (its 10 s stats lines) and
#             nvidia-smi dmon's GPU utilization (dmon-serving-S.log) and top's
#             per-process CPU (top-serving-S.log); no run
#             starts after 480 s; PARASLSTM_PYSPY="DELAY SECONDS [ready]"
#             also samples the engine core with py-spy (pyspy-serving-S.txt;
#             DELAY from the stage's start, or from the first server's
#             readiness with `ready`); a server left running by a call the
#             device tool cut off is stopped first;
#             ARGS `--profile-dir $OUT/prof` has the engine's torch profiler
#             record steps of each model's first run (its kernel table)
#   prefix "ARGS"  benchmarks/paraslstm/benchmark_prefix_caching.py ARGS
#   specbench "ARGS"  benchmarks/paraslstm/benchmark_spec_decode.py ARGS
#             (speculation on against off on the KJV model)
#
# Several stages may be given: `device.sh b tests bench small`.
set -uo pipefail

# A second vLLM (another version) can sit beside the first: its own carry,
# site and log folder, e.g. PARASLSTM_GPU_CARRY=.gpuvllm33
# PARASLSTM_GPU_SITE=/tmp/site33 PARASLSTM_GPU_TAG=v033.
SITE="${PARASLSTM_GPU_SITE:-/tmp/site}"
INTREE="$SITE-tests"
CARRY="${PARASLSTM_GPU_CARRY:-.gpuvllm}"
LOGS="${OUT:-out/gpu}${PARASLSTM_GPU_TAG:+/$PARASLSTM_GPU_TAG}"
mkdir -p "$LOGS"
IMAGE_PYTHONPATH="${PYTHONPATH:-}"
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PARASLSTM_KJV_MODEL="$PWD/examples/paraslstm-kjv"
# The offline Hugging Face cache of the hub-ready folders (prepare_intree).
export HF_HOME="${SITE}-hf"
# One Triton cache for every engine of the lease (vLLM otherwise gives each
# engine configuration its own, and each start recompiles the ParaSLSTM scan
# variants: ~67 s of a 1B start with prefix caching on, 2026-12-01).
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton-cache}"
STATUS=0

note() { echo "=== [$(date +%H:%M:%S)] $*"; }
gpu_pids() { nvidia-smi --query-compute-apps=pid --format=csv,noheader; }
need_site() { [[ -f $SITE/.b_ok ]] || { echo "device.sh: no vLLM in $SITE (run a, b)"; exit 3; }; }

run_pytest() {  # name, timeout, pytest args...
    local name=$1 limit=$2
    shift 2
    note "pytest $name"
    timeout "$limit" python3 -m pytest -p no:cacheprovider -q -rs --durations=8 "$@" 2>&1 \
        | tee "$LOGS/$name.log" | tail -n 40
    local rc=${PIPESTATUS[0]}
    note "pytest $name: rc=$rc"
    [[ $rc == 0 ]] || STATUS=1
    return "$rc"
}

install_pack_wheels() {  # .gpuvllm/t's packages (tests, vllm serve) into $SITE
    python3 -m pip install -q --no-index --no-deps --upgrade --target $SITE \
        "$CARRY"/t/*.whl
}

prepare_intree() {  # the pristine tree's tests/ in $INTREE (.gpuvllm/t)
    install_pack_wheels
    python3 tools/paraslstm/ci/seed_hf_cache.py "$HF_HOME" || exit 3
    rm -rf $INTREE && mkdir -p $INTREE
    tar -xJf "$CARRY/t/tests.tar.xz" -C $INTREE || exit 3
    # vLLM's conftest.py and tests/utils.py (which imports the server): fail
    # here in seconds, not in every test
    PYTHONPATH=$SITE:$INTREE python3 -c "import tests.utils, tests.conftest" || exit 3
}

prepare_stack_tests() {  # $INTREE with the whole stack's test files over it
    prepare_intree
    python3 tools/paraslstm/gpu/install_series.py $SITE \
        "$CARRY/b/paraslstm_series.tar" $INTREE || exit 3
}

run_kernel_bench() {  # name, script, args...
    local name=$1
    shift
    note "$name: $*"
    timeout 300 python3 "$@" 2>&1 | tee "$LOGS/$name.log" | tail -n 60
    [[ ${PIPESTATUS[0]} == 0 ]] || STATUS=1
}

run_manifest_tests() {  # name, site, tests root, series tarball, key (tests|only)
    local name=$1 site=$2 tree=$3 key=${5:-tests} i=0 rc=0
    local gpus
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    while IFS=$'\t' read -r -a args; do
        i=$((i + 1))
        (cd "$tree" && CUDA_VISIBLE_DEVICES=$(( (i - 1) % gpus )) \
            PYTHONPATH=$site:$tree run_pytest "$name-$i" 560 "${args[@]}") || rc=1
    done < <(tar -xOf "$4" manifest.json | python3 -c \
        "import json, sys; [print('\t'.join(t)) for t in json.load(sys.stdin)['$key']]")
    return $rc
}

pids=()
intree_bg() {  # name, pytest args...: in the patched tests/ on GPU 0, in the background
    local name=$1
    shift
    (cd $INTREE && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$SITE:$INTREE \
        VLLM_ENABLE_V1_MULTIPROCESSING=0 run_pytest "$name" 560 "$@" \
        >"$LOGS/$name.out") &
    pids+=($!)
}

wait_bg() {  # every background job in pids (intree_bg's among them)
    for pid in "${pids[@]}"; do wait "$pid" || STATUS=1; done
    pids=()
}

copy_project_tests() {  # project_tests/intree as the patched tree's tests/paraslstm_project
    rm -rf $INTREE/tests/paraslstm_project
    cp -r project_tests/intree $INTREE/tests/paraslstm_project
}

bench() {  # suite
    note "bench $1"
    VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout 570 python3 \
        benchmarks/paraslstm/benchmark_engine_gpu.py --suite "$1" \
        --json "$LOGS/bench-$1.jsonl" --profile "$LOGS/profile" \
        >"$LOGS/bench-$1.log" 2>&1
    local rc=$?
    grep -v "^INFO\|^WARNING\|^(EngineCore\|^DEBUG" "$LOGS/bench-$1.log" | tail -n 40
    note "bench $1: rc=$rc"
    return $rc
}

while [[ $# -gt 0 ]]; do
    stage=$1
    shift
    case $stage in
    a)
        rm -rf $SITE && mkdir -p $SITE
        if [[ -f "$CARRY/a/vllm_c.tar.xz" ]]; then
            tar -xJf "$CARRY/a/vllm_c.tar.xz" -C $SITE && touch $SITE/.a_ok
        else
            cp "$CARRY"/a/vllm_c.tar.xz.00 $SITE.vllm_c.00
        fi
        note "a: done"
        ;;
    a2)
        cat $SITE.vllm_c.00 "$CARRY"/a2/vllm_c.tar.xz.01 | tar -xJ -C $SITE \
            && touch $SITE/.a_ok
        note "a2: unpacked"
        ;;
    b)
        [[ -f $SITE/.a_ok ]] || { echo "device.sh: stage a missing"; exit 3; }
        tar -xJf "$CARRY/b/vllm_rest.tar.xz" -C $SITE || exit 3
        python3 tools/paraslstm/gpu/install_series.py $SITE \
            "$CARRY/b/paraslstm_series.tar" || exit 3
        # Test environment only: 0.34's CUDA warm-up imports the MiniMax-M3
        # MSA kernels, whose CuTe DSL (nvidia-cutlass-dsl, ~95 MB) is not
        # carried; the stack does not touch that module.
        msa=$SITE/vllm/model_executor/warmup/minimax_m3_msa_warmup.py
        if [[ -f $msa ]] && ! python3 -c "import cutlass" 2>/dev/null; then
            printf 'def minimax_m3_msa_warmup(worker):\n    return None\n' >"$msa"
            note "b: no cutlass here; MiniMax-M3 MSA warm-up stubbed"
        fi
        python3 -c "import vllm, torch, triton; \
from vllm.model_executor.models.paraslstm import ParaSLSTMForCausalLM; \
print('vllm', vllm.__version__, 'torch', torch.__version__, \
'triton', triton.__version__, 'gpus', torch.cuda.device_count())" || exit 3
        touch $SITE/.b_ok
        nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
        ;;
    series)
        # $SITE's vLLM with the stack up to folder $1 (`all`: the whole
        # stack), e.g. a model served without a later PR; needs b
        need_site
        tarball="$CARRY/b/paraslstm_series-$1.tar"
        [[ $1 == all ]] && tarball="$CARRY/b/paraslstm_series.tar"
        python3 tools/paraslstm/gpu/install_series.py $SITE "$tarball" || exit 3
        note "series: $SITE has the stack up to $1"
        shift
        ;;
    tests)
        # The whole stack's tests (series.py tests) in the patched tests/,
        # the kernel tests on the last GPU beside the model tests on GPU 0.
        need_site
        prepare_stack_tests
        run_manifest_tests full $SITE $INTREE "$CARRY/b/paraslstm_series.tar"
        ;;
    stack)
        # Every prefix of the stack in its own copy of vLLM and tests/, its
        # last PR's tests, all at once on the GPUs (each test engine sizes
        # its cache in bytes).
        need_site
        prepare_intree
        for tarball in "$CARRY"/b/paraslstm_series-*.tar; do
            folder=$(basename "$tarball" .tar)
            folder=${folder#paraslstm_series-}
            rm -rf $SITE-$folder $INTREE-$folder
            cp -a $SITE $SITE-$folder && cp -a $INTREE $INTREE-$folder
            python3 tools/paraslstm/gpu/install_series.py $SITE-$folder \
                "$tarball" $INTREE-$folder >/dev/null || exit 3
            (run_manifest_tests "$folder" $SITE-$folder $INTREE-$folder "$tarball" only \
                >"$LOGS/stack-$folder.out" 2>&1) &
            pids+=($!)
        done
        wait_bg
        cat "$LOGS"/stack-*.out
        ;;
    project)
        # This project's in-tree suite (project_tests/intree) in the patched
        # tree of the whole stack (run `tests` first).
        need_site
        [[ -d $INTREE/tests ]] || { echo "device.sh: run the tests stage first"; exit 3; }
        copy_project_tests
        read -r -a selection <<<"${1:-tests/paraslstm_project}"
        shift || true
        (cd $INTREE && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$SITE:$INTREE \
            run_pytest project 560 "${selection[@]}") || STATUS=1
        ;;
    ptests)
        # The whole stack's tests (series.py tests) in the patched tests/, all
        # at once on GPU 0 (each test engine sizes its cache in bytes).
        need_site
        prepare_stack_tests
        i=0
        while IFS=$'\t' read -r -a args; do
            i=$((i + 1))
            intree_bg full-$i "${args[@]}"
        done < <(tar -xOf "$CARRY/b/paraslstm_series.tar" manifest.json | python3 -c \
            "import json, sys; [print('\t'.join(t)) for t in json.load(sys.stdin)['tests']]")
        wait_bg
        grep -h -E "^=== |passed|failed|error" "$LOGS"/full-*.out
        ;;
    pproject)
        # project_tests/intree (or the files A), one pytest per file at once,
        # in the patched tests/ of ptests (prepared here when ptests did not run)
        need_site
        [[ -d $INTREE/tests ]] || prepare_stack_tests
        copy_project_tests
        read -r -a files <<<"${PARASLSTM_PROJECT_FILES:-$(cd project_tests/intree && ls test_*.py | tr '\n' ' ')}"
        for f in "${files[@]}"; do
            intree_bg "project-${f%.py}" "tests/paraslstm_project/$f"
        done
        wait_bg
        grep -h -E "^=== |passed|failed|error" "$LOGS"/project-*.out
        ;;
    pplugin)
        # project_tests/plugin files ($PARASLSTM_PLUGIN_FILES, default the
        # sampled-speculation checks) against the patched vLLM, one pytest
        # per file, all at once on GPU 0
        need_site
        install_pack_wheels
        read -r -a files <<<"${PARASLSTM_PLUGIN_FILES:-test_paraslstm_spec_distribution.py test_paraslstm_spec_sampling.py test_paraslstm_soak.py}"
        for f in "${files[@]}"; do
            (CUDA_VISIBLE_DEVICES=0 run_pytest "plugin-${f%.py}" 560 \
                "project_tests/plugin/$f" >"$LOGS/plugin-${f%.py}.out") &
            pids+=($!)
        done
        wait_bg
        grep -h -E "^=== |passed|failed|error" "$LOGS"/plugin-*.out
        ;;
    plugin)
        # The plugin on the pristine vLLM of the pack: install it into a venv
        # that sees that vLLM, generate with the KJV model, check the edits.
        need_site
        rm -rf $SITE-pristine && cp -a $SITE $SITE-pristine
        python3 tools/paraslstm/gpu/install_series.py --undo $SITE-pristine || exit 3
        # pip install into a site dir of its own; a sitecustomize adds it as a
        # site dir (so its .pth runs, in spawned engine processes too).
        rm -rf /tmp/plugin-site /tmp/plugin-boot && mkdir -p /tmp/plugin-boot
        python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/plugin-site . \
            >"$LOGS/plugin-install.log" 2>&1 || { tail "$LOGS/plugin-install.log"; exit 3; }
        echo "import site; site.addsitedir('/tmp/plugin-site')" >/tmp/plugin-boot/sitecustomize.py
        plugin_path=/tmp/plugin-boot:$SITE-pristine${IMAGE_PYTHONPATH:+:$IMAGE_PYTHONPATH}
        note "plugin on pristine vLLM"
        (cd /tmp && PYTHONPATH=$plugin_path VLLM_PLUGINS=paraslstm timeout 400 \
            python3 "$OLDPWD/tools/paraslstm/ci/plugin_smoke.py" \
            >"$LOGS/plugin-smoke.log" 2>&1 && PYTHONPATH=$plugin_path \
            VLLM_PLUGINS=paraslstm timeout 300 python3 \
            "$OLDPWD/examples/paraslstm_generate.py" --max-tokens 24 \
            >"$LOGS/plugin-generate.log" 2>&1) || STATUS=1
        tail -n 3 "$LOGS/plugin-smoke.log"
        grep -v "^INFO\|^WARNING\|^(EngineCore\|^DEBUG" "$LOGS/plugin-generate.log" | tail -n 8
        ;;
    parallel)
        need_site
        [[ -d $INTREE/tests ]] || { echo "device.sh: run the tests stage first"; exit 3; }
        copy_project_tests
        (cd $INTREE && PYTHONPATH=$SITE:$INTREE run_pytest parallel 400 \
            tests/paraslstm_project/test_paraslstm_parallel.py) || STATUS=1
        ;;
    intree)
        need_site
        prepare_stack_tests
        read -r -a selection <<<"$1"
        shift
        (cd $INTREE && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$SITE:$INTREE \
            run_pytest intree 560 "${selection[@]}") || STATUS=1
        ;;
    only)
        need_site
        read -r -a selection <<<"$1"
        shift
        CUDA_VISIBLE_DEVICES=0 run_pytest only 500 "${selection[@]}"
        ;;
    bench)
        need_site
        bench "$1" || STATUS=1
        shift
        ;;
    rounds)
        need_site
        note "rounds $1 $2 x$3"
        timeout 590 python3 benchmarks/paraslstm/benchmark_engine_gpu.py --suite "$1" \
            --only "$2" --rounds "$3" --no-decode1 --json "$LOGS/rounds-$1.jsonl" \
            >"$LOGS/rounds-$1.log" 2>&1 || STATUS=1
        grep "^==\|JIT compilation" "$LOGS/rounds-$1.log"
        cat "$LOGS/rounds-$1.jsonl"
        shift 3
        ;;
    benchpair)
        need_site
        s1=$1 s2=$2
        shift 2
        (CUDA_VISIBLE_DEVICES=1 bench "$s2" >"$LOGS/bench-$s2.out" 2>&1) &
        other=$!
        CUDA_VISIBLE_DEVICES=0 bench "$s1"
        wait $other || STATUS=1
        cat "$LOGS/bench-$s2.out"
        ;;
    serve)
        need_site
        install_pack_wheels || exit 3
        read -r -a extra <<<"$2"
        note "serve $1 ${extra[*]}"
        # A call the device tool cut off leaves its server running on the
        # warm machine, holding GPU memory (2026-12-06): stop it first.
        left=$(gpu_pids)
        if [[ -n $left ]]; then
            note "serve: stopping a previous call's server (GPU pids $(echo $left))"
            pkill -f 'vllm_cli.py serve'; pkill -f 'VLLM::'; kill $left 2>/dev/null
            for _ in $(seq 30); do
                [[ -z $(gpu_pids) ]] && break
                sleep 1
            done
        fi
        # the engine core's one thread can bound a served step: name the host
        note "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ($(nproc) cores)"
        plot=()  # without matplotlib there: --replot the jsonl elsewhere
        python3 -c "import matplotlib" 2>/dev/null && plot=(--plot "$LOGS/serving-$1.png")
        # GPU utilization a second, beside the rows' front-end and engine CPU
        nvidia-smi dmon -s u -d 1 -o DT >"$LOGS/dmon-serving-$1.log" 2>&1 &
        dmon=$!
        # and each process's CPU over 4-s frames (API servers, engine core,
        # client); one top per frame: its exit flushes the frame to the log,
        # where one long top's buffered last frames were lost when stopped
        timeout 600 bash -c 'while :; do top -b -c -w 200 -d 4 -n 2 |
            awk "/^top -/ {f++} f == 2 && n++ < 24"; done' \
            >"$LOGS/top-serving-$1.log" 2>&1 &
        topp=$!
        # PARASLSTM_PYSPY="DELAY SECONDS [ready]": py-spy samples of the engine
        # core (with one GPU the model runner's Python runs in it too) from
        # DELAY s after the stage starts (with `ready`: after the first
        # server is ready), for SECONDS s
        if [[ -n ${PARASLSTM_PYSPY:-} ]]; then
            read -r delay secs from <<<"$PARASLSTM_PYSPY"
            (if [[ ${from:-} == ready ]]; then
                 for _ in $(seq 590); do
                     grep -q "^== .*: ready in" "$LOGS/serving-$1.log" 2>/dev/null && break
                     sleep 1
                 done
             fi
             sleep "$delay"
             # the engine core is the server's one process on the GPU
             pid=$(gpu_pids | head -n 1)
             spy=$(find $SITE -path '*bin/py-spy' -type f | head -n 1)
             if [[ -n $pid && -n $spy ]]; then
                 chmod +x "$spy"
                 "$spy" record --pid "$pid" --duration "$secs" --rate 200 \
                     --nonblocking --format raw --output "$LOGS/pyspy-serving-$1.txt"
             else
                 echo "pyspy: engine core '$pid', py-spy '$spy'"
             fi) >"$LOGS/pyspy-serving-$1.log" 2>&1 &
        fi
        timeout 590 python3 benchmarks/paraslstm/benchmark_serving.py --suite "$1" \
            --server-log-dir "$LOGS" --stop-after 480 "${extra[@]}" \
            --json "$LOGS/serving-$1.jsonl" "${plot[@]}" \
            >"$LOGS/serving-$1.log" 2>&1 || STATUS=1
        kill "$dmon" "$topp" 2>/dev/null
        grep "^==\|^|\|^- \|TTFT\|Error" "$LOGS/serving-$1.log" | tail -n 40
        shift 2
        ;;
    prefix)
        need_site
        read -r -a extra <<<"$1"
        note "prefix ${extra[*]}"
        timeout 590 python3 benchmarks/paraslstm/benchmark_prefix_caching.py \
            "${extra[@]}" --json "$LOGS/prefix.json" >"$LOGS/prefix.log" 2>&1 || STATUS=1
        grep -v "^{" "$LOGS/prefix.log" | tail -n 40
        shift
        ;;
    specbench)
        need_site
        read -r -a extra <<<"$1"
        note "specbench ${extra[*]}"
        timeout 590 python3 benchmarks/paraslstm/benchmark_spec_decode.py \
            "${extra[@]}" --json "$LOGS/specbench.jsonl" >"$LOGS/specbench.log" 2>&1 \
            || STATUS=1
        grep "^|" "$LOGS/specbench.log"
        shift
        ;;
    kernelbench)
        need_site
        run_kernel_bench kernelbench benchmarks/kernels/benchmark_paraslstm.py \
            --no-peers --json "$LOGS/kernelbench.json"
        ;;
    *)
        echo "device.sh: unknown stage $stage"
        exit 2
        ;;
    esac
done
note "done: status $STATUS"
exit $STATUS
