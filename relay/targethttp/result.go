package targethttp

// Stage is how far a call got: whether its request may have reached the
// target, and how much of the answer came back.
type Stage uint8

// The stages of a call, in the order a call goes through them.
const (
	// NotSent: no byte of the request was written to a connection to the
	// target (the dial failed, a kept-alive connection was found closed,
	// the TLS handshake failed, the hub gave up first). The target cannot
	// have processed it.
	NotSent Stage = iota
	// PartlySent: some bytes of the request were written, not all.
	PartlySent
	// Sent: the whole request was written, and no byte of an answer read.
	Sent
	// AnswerPartlyRead: some bytes of an answer were read, but it is
	// incomplete, not HTTP, over the cap, or not the target protocol.
	AnswerPartlyRead
	// Answered: a full answer in the target protocol was read (whatever
	// its code).
	Answered
)

// String returns the stage's name in the in-doubt journal
// ("request_sent", ...), or "not_sent" and "answered".
func (s Stage) String() string {
	switch s {
	case NotSent:
		return "not_sent"
	case PartlySent:
		return "request_partly_sent"
	case Sent:
		return "request_sent"
	case AnswerPartlyRead:
		return "answer_partly_read"
	case Answered:
		return "answered"
	default:
		return "unknown"
	}
}

// InDoubt reports whether a call that ended at this stage may have been
// processed by the target without the hub knowing its outcome: some of the
// request went out and no full answer in the target protocol came back.
func (s Stage) InDoubt() bool {
	return s == PartlySent || s == Sent || s == AnswerPartlyRead
}

// Result is the outcome of one Call. It is a plain value.
type Result struct {
	// Code and Msg are the answer the client gets; Msg is raw (the
	// response writer cleans and caps it).
	Code string
	Msg  []byte
	// Stage is how far the call got.
	Stage Stage
	// BytesSent is how many bytes of the request were written to the
	// target's connection (for https, before encryption), when the call
	// is in doubt; zero otherwise.
	BytesSent int
	// Retried reports that the call was tried a second time because the
	// first try failed to connect (see Call).
	Retried bool
	// Fault, when not NoHubFault, says that the call failed for want of the
	// hub's own resources before any byte of the request went out: Code is
	// E906, Msg "hub overloaded; not sent", and the target is not to blame.
	Fault HubFault
	// Err is the local error behind Fault, for the log; nil otherwise.
	Err error
	// LateRead reports that the call timed out and its connection is read
	// on for the grace (Config.LateAnswerGrace): its answer may yet come
	// through Config.OnLateAnswer.
	LateRead bool
}

// HubFault is the hub's own resource a call could not get, which is no
// failure of its target. It is a plain value.
type HubFault uint8

// The hub's own faults, as told from the error of a dial or of a write
// that sent nothing.
const (
	// NoHubFault: the call did not fail for want of the hub's resources.
	NoHubFault HubFault = iota
	// FaultDescriptors: the process or the system is out of file
	// descriptors (EMFILE, ENFILE).
	FaultDescriptors
	// FaultMemory: the kernel had no memory or buffer space for the
	// socket (ENOMEM, ENOBUFS).
	FaultMemory
	// FaultPorts: no local address or ephemeral port was free for the
	// connection (EADDRNOTAVAIL).
	FaultPorts
	// FaultSocket: another failure of the hub's own socket calls, before
	// the connect (socket, setsockopt).
	FaultSocket
	// NumHubFaults is the number of HubFault values, NoHubFault included.
	NumHubFaults
)

// String returns the fault's label value in the hub's metrics:
// "descriptors", "memory", "ports", "socket", or "none".
func (f HubFault) String() string {
	switch f {
	case FaultDescriptors:
		return "descriptors"
	case FaultMemory:
		return "memory"
	case FaultPorts:
		return "ports"
	case FaultSocket:
		return "socket"
	default:
		return "none"
	}
}

// Messages of answers made up about a call. Each failure the hub makes up
// ends with one of two suffixes: suffixNotSent when no byte of the request
// went out (the target cannot have processed it), suffixInDoubt when the
// request may have reached the target and its outcome is unknown.
const (
	suffixNotSent = "; not sent"
	suffixInDoubt = "; outcome unknown"

	msgTimeout        = "no answer within target timeout"
	msgAborted        = "no answer before shutdown"
	msgRefusedConn    = "target unreachable: connection refused"
	msgResetConn      = "target unreachable: connection reset"
	msgClosedEarly    = "target unreachable: connection closed before a full answer"
	msgUnreachable    = "target unreachable"
	msgTLSFailed      = "target unreachable: TLS handshake failed"
	msgAnswerTooLarge = "target answer too large"
	msgNotProtocol    = "target answer is not the target protocol"
	msgNotHTTP        = "target answer is not HTTP"
	msgBadTargetCode  = "target answered a code of unknown form"
	msgHubOverloaded  = "hub overloaded"
)

// withSuffix returns msg followed by the suffix of stage: "; not sent" or
// "; outcome unknown".
func withSuffix(msg string, stage Stage) []byte {
	suffix := suffixNotSent
	if stage.InDoubt() {
		suffix = suffixInDoubt
	}
	b := make([]byte, 0, len(msg)+len(suffix))
	return append(append(b, msg...), suffix...)
}
