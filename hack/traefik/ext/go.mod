// Stand-in for Traefik's nested module github.com/traefik/traefik/dynamic/ext. Traefik's go.mod replaces it with a
// folder of its own repository (./pkg/config/dynamic/ext) that the module proxy's zip of traefik/v3 leaves out, and
// the proxy does not serve it as a module either. hack/build-binaries.sh points the replace directive here.
module github.com/traefik/traefik/dynamic/ext

go 1.22
