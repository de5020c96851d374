// A consumer on orbit's pcgroups library (ElasticConsume with the library's defaults: explicit
// acks, ack wait 5 s), for the interop tests: it consumes one member until SIGTERM (finishing the
// message in hand first) and prints one line per message it processed and double-acked:
//
//	processed seq=<work-queue seq> origin=<origin stream> <origin seq> acked
//
// or "... not-acked <error>" when the double ack failed.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/pcgroups"
)

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: orbit-library URL STREAM GROUP MEMBER SLEEP")
		os.Exit(1)
	}
	url, stream, group, member := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	sleep, err := time.ParseDuration(os.Args[5])
	if err != nil {
		fmt.Fprintln(os.Stderr, "SLEEP:", err)
		os.Exit(1)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(2)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(2)
	}
	var inFlight sync.Mutex // held while a message is handled: a stop waits for its outcome line
	handler := func(msg jetstream.Msg) {
		inFlight.Lock()
		defer inFlight.Unlock()
		meta, err := msg.Metadata()
		if err != nil {
			fmt.Println("metadata:", err)
			return
		}
		source := strings.Fields(msg.Headers().Get("Nats-Stream-Source"))
		if len(source) > 2 {
			source = source[:2]
		}
		time.Sleep(sleep)
		if err := msg.DoubleAck(context.Background()); err != nil {
			fmt.Printf("processed seq=%d origin=%s not-acked %v\n", meta.Sequence.Stream, strings.Join(source, " "), err)
			return
		}
		fmt.Printf("processed seq=%d origin=%s acked\n", meta.Sequence.Stream, strings.Join(source, " "))
	}
	cc, err := pcgroups.ElasticConsume(context.Background(), js, stream, group, member, handler,
		jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		fmt.Fprintln(os.Stderr, "consume:", err)
		os.Exit(2)
	}
	fmt.Println("consuming")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
	case err := <-cc.Done():
		if err != nil {
			fmt.Fprintln(os.Stderr, "done:", err)
		}
	}
	cc.Stop()
	inFlight.Lock() // the message being handled is acked (or not) and printed before we exit
}
