package main

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// The kind lab's pods run `nave demo-backend`: it answers health checks
// with its name, and stops with its context.
func TestDemoBackend(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runDemoBackend(ctx, []string{"--addr", addr, "--name", "east/pod-1"}) }()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var md metadata.MD
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true), grpc.Header(&md)); err != nil {
		t.Fatal(err)
	}
	if got := md.Get(backendHeader); len(got) != 1 || got[0] != "east/pod-1" {
		t.Errorf("backend header %v, want east/pod-1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("demo-backend returned %v after its context ended", err)
	}
}
