// Package kafkaenv runs an in-process Kafka cluster, franz-go's kfake, for
// headway's own tests and example programs. It is not part of headway's API
// and users should not import it.
//
// [Start] listens on 127.0.0.1 ports, seeds the topics asked for and lets
// groups use short session timeouts, so that with [FastClientOpts] a
// consumer group forms and rebalances in a fraction of a second. [New] is
// the form tests use. [Cluster.Fake] exposes kfake itself for fault
// injection.
package kafkaenv
