// Package sdkcorpus checks the plugin's tables against Consul's SDK itself
// over a generated corpus of redirect configurations, in real network
// namespaces: for each config the SDK's own output is applied in one
// namespace, the plugin's in another, and the tables are compared.
//
//	go test -tags privileged ./tests/suites/sdkcorpus -corpus.n 2000
package sdkcorpus
