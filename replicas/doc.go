// Package replicas is how hub replicas act as one hub: membership by gossip
// (hashicorp/memberlist), replication of every cluster's data to every
// replica, fenced by stamps, the leader elected in etcd, the cluster catalog
// and epochs kept there, and the registry snapshots the leader persists and a
// starting replica restores. The spoke-hub protocol and the replication
// service's messages are in federation and federation/v1.
package replicas
