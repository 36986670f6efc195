#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy, pinned, cached by version.
#
#   python -m rerank_devcluster build      # the usual way: passes the pinned versions
#   K8S_VERSION=.. ETCD_VERSION=.. KWOK_VERSION=.. HELM_VERSION=.. hack/build-binaries.sh [all|kubernetes|kubelet|etcd|kwok|helm]
#
# Everything lands in ${RERANK_CACHE:-~/.cache/rerank-operator}/<component>-<version>/ so a rerun is instant
# and a version bump builds next to the old one. No GitHub, no dl.k8s.io: only proxy.golang.org.
set -euo pipefail

# The pinned versions live in hack/rerank_devcluster/binaries.py (one source); it runs this script with them set.
: "${K8S_VERSION:?set by rerank_devcluster.binaries}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}" "${HELM_VERSION:?}"
CACHE="${RERANK_CACHE:-$HOME/.cache/rerank-operator}"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
# Go 1.25+ would otherwise fetch a toolchain named in a module's go line; the machine's Go is new enough.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[build-binaries] %s\n' "$*" >&2; }

have_all() {  # have_all DIR NAME...
  local dir="$1"; shift
  for n in "$@"; do [ -x "$dir/$n" ] || return 1; done
}

# Kubernetes: k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local folders the
# proxy cannot serve. A wrapper module replaces each one with its published v0.X.Y, derived from the kubernetes
# module's own go.mod so the list follows the release. The control plane and the real node's kubelet are built
# from the same wrapper module (same versions of every dependency); the kubelet is a separate step so that a cache
# made before the real node existed only gains the kubelet.
build_k8s_cmds() {  # build_k8s_cmds CMD...
  local out="$CACHE/kubernetes-v$K8S_VERSION"
  have_all "$out" "$@" && return 0
  local minor="${K8S_VERSION#*.}"; minor="0.${minor}"
  local work; work="$(mktemp -d)"
  log "building $* v$K8S_VERSION in $work (cold build: many minutes on 2 cores)"
  (
    cd "$work"
    go mod init rerank.local/kubernetes-build >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$gomod" | awk '{print $1}' | sort -u > staging.txt
    [ -s staging.txt ] || { log "no staging modules found in $gomod"; exit 1; }
    while read -r mod; do go mod edit -replace "$mod=$mod@v$minor"; done < staging.txt
    grep -E '^godebug' "$gomod" >> go.mod || true
    go mod edit -require "k8s.io/kubernetes@v$K8S_VERSION"
    local pkgs=()
    for cmd in "$@"; do
      go get -tool "k8s.io/kubernetes/cmd/$cmd@v$K8S_VERSION"
      pkgs+=("k8s.io/kubernetes/cmd/$cmd")
    done
    local major="${K8S_VERSION%%.*}" mnr; mnr="$(echo "$K8S_VERSION" | cut -d. -f2)"
    local ld="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$mnr"
    ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$mnr"
    mkdir -p bin
    go build -trimpath -ldflags "$ld" -o bin/ "${pkgs[@]}"
    # Add to the version's directory without disturbing binaries already there (a reader never sees half a file).
    mkdir -p "$out"
    for cmd in "$@"; do cp "bin/$cmd" "$out/.$cmd.tmp" && mv "$out/.$cmd.tmp" "$out/$cmd"; done
  )
  rm -rf "$work"
}

# etcd: the server's main package is the module go.etcd.io/etcd/server/v3 itself.
build_etcd() {
  local out="$CACHE/etcd-v$ETCD_VERSION"
  have_all "$out" etcd && return 0
  local work; work="$(mktemp -d)"
  log "building etcd v$ETCD_VERSION"
  (
    cd "$work"
    go mod init rerank.local/etcd-build >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    mkdir -p bin && go build -trimpath -ldflags "-s -w" -o bin/etcd go.etcd.io/etcd/server/v3
    mkdir -p "$out.tmp" && cp bin/etcd "$out.tmp/" && rm -rf "$out" && mv "$out.tmp" "$out"
  )
  rm -rf "$work"
}

go_install() {  # go_install NAME PACKAGE VERSION DIR
  local name="$1" pkg="$2" version="$3" out="$4"
  have_all "$out" "$name" && return 0
  log "building $name $version"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w" "$pkg@$version"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

main() {
  mkdir -p "$CACHE"
  local only="${1:-all}"
  case "$only" in
    all|kubernetes) build_k8s_cmds kube-apiserver kube-controller-manager kube-scheduler kubectl ;;&
    all|kubelet) build_k8s_cmds kubelet ;;&
    all|etcd) build_etcd ;;&
    all|kwok) go_install kwok sigs.k8s.io/kwok/cmd/kwok "v$KWOK_VERSION" "$CACHE/kwok-v$KWOK_VERSION" ;;&
    all|helm) go_install helm helm.sh/helm/v3/cmd/helm "v$HELM_VERSION" "$CACHE/helm-v$HELM_VERSION" ;;&
    *) ;;
  esac
  log "binaries cached under $CACHE"
}
main "$@"
