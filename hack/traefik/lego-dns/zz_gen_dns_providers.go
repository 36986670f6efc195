// The rerank-operator dev cluster's own replacement for lego's generated DNS-provider registry
// (github.com/go-acme/lego/v5/providers/dns/zz_gen_dns_providers.go), which hack/build-binaries.sh puts in place of
// that file in a build-time copy of the lego module.
//
// The generated registry imports every DNS provider lego knows (about 180), and with them their vendors' SDKs, some
// of which the Go module proxy refuses to serve (403: ucloud, yandex-cloud, huaweicloud, ...). Traefik reaches them
// only through this one function, for ACME DNS-01 challenges; the dev cluster's gateway terminates no TLS from an
// ACME CA, so a build without any DNS provider loses nothing it uses, and asking for one fails with a clear error.

package dns

import (
	"fmt"

	"github.com/go-acme/lego/v5/challenge"
)

// NewDNSChallengeProviderByName keeps lego's signature; no provider is compiled in, so every name is an error.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("DNS-01 provider %q is not in this Traefik build (rerank-operator dev cluster: built "+
		"without lego's DNS providers, see hack/build-binaries.sh)", name)
}
