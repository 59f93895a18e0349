// SPDX-License-Identifier: Apache-2.0

// Package failovertest kills a MariaDB primary under publishers and checks
// the queue on its promoted replica. Its test runs only with the build tag
// "failover", from scripts/mariadb-failover, which starts the servers and
// sets up their replication.
package failovertest
