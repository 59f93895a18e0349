// SPDX-License-Identifier: Apache-2.0

package shardq

import "github.com/shardq/shardq/internal/tenants"

// The tenants' settings rows are read and cached in internal/tenants;
// these are the public names of a suspension.

// ErrTenantSuspended refuses a publish, receive or accept in a suspended
// tenant, and a consumer's write that keeps or adds something (a group's
// state, a deferral, a longer visibility) (Admin.SuspendTenant); the
// error is a *TenantSuspendedError.
var ErrTenantSuspended = tenants.ErrTenantSuspended

// TenantSuspendedError names the suspended tenant and since when. Its
// fields (the type is defined in an internal package, so go doc shows
// only this alias):
//
//	Tenant string
//	Since  time.Time
//
// A *TenantSuspendedError is the error, and errors.Is(err,
// ErrTenantSuspended) matches it.
type TenantSuspendedError = tenants.TenantSuspendedError
