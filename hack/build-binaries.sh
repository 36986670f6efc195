#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy, pinned, cached by version.
#
#   python -m rerank_devcluster build      # the usual way: passes the pinned versions
#   K8S_VERSION=.. ETCD_VERSION=.. KWOK_VERSION=.. HELM_VERSION=.. TRAEFIK_VERSION=.. \
#     hack/build-binaries.sh [all|kubernetes|kubelet|etcd|kwok|helm|traefik]
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

# The project's own stand-ins for the parts of Traefik's build that the proxy does not serve (build_traefik).
TRAEFIK_SHIMS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/traefik"

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

# Traefik, the dev cluster's Gateway API implementation (rerank_devcluster.gateway). Its module does not build from
# the proxy as it stands; a wrapper module requires it and fixes three things, nothing in Traefik's own code:
#  - Traefik's go.mod replaces the nested module github.com/traefik/traefik/dynamic/ext with a folder of its
#    repository that the module zip leaves out (and the proxy does not serve that module): every such local replace
#    must have a stand-in under hack/traefik/ whose go.mod names the module (hack/traefik/ext: two empty structs).
#  - its go-http-auth fork (github.com/containous/go-http-auth) is pinned to a commit the proxy refuses (403):
#    HTTP_AUTH_FORK is the fork's previous published version (the one Traefik v3.6 used), with the same API.
#  - lego's generated DNS-provider registry imports ~180 DNS providers' SDKs, some of which the proxy refuses. lego
#    is built from a copy of its proxy zip in the build's temporary folder with that one file swapped for
#    hack/traefik/lego-dns/zz_gen_dns_providers.go (no DNS-01 providers; the dev cluster does no ACME). A copy,
#    because `go build -overlay` may not replace files in the module cache.
# Traefik's other replace directives (forks the proxy serves) and its excludes are carried over from its go.mod.
HTTP_AUTH_FORK="github.com/containous/go-http-auth@v0.4.1-0.20200324110947-a37a7636d23e"
build_traefik() {
  # Checked here, not with the others above: building another component needs no Traefik version.
  : "${TRAEFIK_VERSION:?set by rerank_devcluster.binaries}"
  local out="$CACHE/traefik-v$TRAEFIK_VERSION"
  have_all "$out" traefik && return 0
  local work; work="$(mktemp -d)"
  log "building traefik v$TRAEFIK_VERSION in $work (cold build: ~10 minutes on 2 cores)"
  (
    cd "$work"
    export GOFLAGS="$GOFLAGS -mod=mod"
    go mod init rerank.local/traefik-build >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "github.com/traefik/traefik/v3@v$TRAEFIK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    # One `go mod edit` argument per line: Traefik's replaces (local ones pointed at our stand-ins) and excludes.
    go mod edit -json "$gomod" | python3 -c '
import json, pathlib, sys
mod, shims = json.load(sys.stdin), pathlib.Path(sys.argv[1])
ours = {}
for f in shims.glob("*/go.mod"):
    ours.update((ln.split()[1], f.parent) for ln in f.read_text().splitlines() if ln.startswith("module "))
for r in mod.get("Replace") or []:
    old, new = r["Old"]["Path"], r["New"]
    if "Version" in new:
        print("-replace=" + old + "=" + new["Path"] + "@" + new["Version"])
    elif old in ours:
        print("-replace=" + old + "=" + str(ours[old]))
    else:
        sys.exit("traefik replaces " + old + " with its folder " + new["Path"] + ", which the proxy does not ship: "
                 "add a stand-in module under " + str(shims))
for e in mod.get("Exclude") or []:
    print("-exclude=" + e["Path"] + "@" + e["Version"])
' "$TRAEFIK_SHIMS" > edits.txt
    xargs go mod edit < edits.txt
    go mod edit -replace "github.com/abbot/go-http-auth=$HTTP_AUTH_FORK"
    go mod edit -require "github.com/traefik/traefik/v3@v$TRAEFIK_VERSION"
    local lego
    lego="$(go mod download -json "github.com/go-acme/lego/v5@$(go list -m -f '{{.Version}}' github.com/go-acme/lego/v5)" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
    cp -r "$lego" lego && chmod -R u+w lego
    cp "$TRAEFIK_SHIMS/lego-dns/zz_gen_dns_providers.go" lego/providers/dns/zz_gen_dns_providers.go
    go mod edit -replace github.com/go-acme/lego/v5=./lego
    mkdir -p bin
    go build -trimpath -ldflags "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=v$TRAEFIK_VERSION" \
      -o bin/traefik github.com/traefik/traefik/v3/cmd/traefik
    mkdir -p "$out.tmp" && cp bin/traefik "$out.tmp/" && rm -rf "$out" && mv "$out.tmp" "$out"
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
    all|traefik) build_traefik ;;&
    *) ;;
  esac
  log "binaries cached under $CACHE"
}
main "$@"
